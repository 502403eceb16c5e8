"""Progress of a prefill that moves within a forward on a CPU: there one forward of a long prompt takes a minute or
more, and a count of forwards alone would stand still for it. Forward hooks on the decoder layers report the
layers done as a fraction of a forward; on a GPU (forwards of milliseconds, timed to the microsecond) none are
added."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from ..models import LoadedModel


def decoder_layers(model) -> list[torch.nn.Module]:
    """The decoder layers of a causal LM: the module list as long as the model's layer count."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return list(module)
    return []


@contextlib.contextmanager
def layer_progress(lm: LoadedModel, progress: Callable[[float, int], None] | None, forwards: int
                   ) -> Iterator[Callable[[int, int], None] | None]:
    """Yield the per-forward progress(done, total) callback to give `report.run_prefill`; it calls `progress` with
    the forwards done, and on a CPU with fractions of a forward in between, as its layers finish. `forwards`: the
    total until the first forward says it. Layers that run after the last forward (the answer's tokens) are not
    counted."""
    if progress is None:
        yield None
        return
    layers = decoder_layers(lm.model) if lm.device.type == "cpu" else []
    state = {"done": 0, "total": forwards, "layers": 0}

    def on_layer(module, args, output) -> None:
        if state["done"] >= state["total"]:
            return
        state["layers"] += 1
        if state["layers"] < len(layers):
            progress(state["done"] + state["layers"] / len(layers), state["total"])

    def per_forward(done: int, total: int) -> None:
        state.update(done=done, total=total, layers=0)
        progress(done, total)

    handles = [layer.register_forward_hook(on_layer) for layer in layers]
    try:
        yield per_forward
    finally:
        for h in handles:
            h.remove()
