"""Swap the attention function of a Hugging Face model for the length of a `with` block.

Every forward that computes attention its own way (the profiling statistics, the sparse prefill, the evaluation
probes, the benchmarks' stand-ins) goes through `swapped_attention`: the function is registered with
transformers' `AttentionInterface` under a name, the model switches to it, and the previous implementation is
restored on the way out, whatever happens inside. What the function reads besides its arguments (a plan, a
callback) it finds on a thread-local that the block sets and clears.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator


def _attention_configs(model) -> list:
    """The distinct configs whose attention implementation the model's layers read: the model's own and those of
    sub-models (found once per model)."""
    configs = model.__dict__.get("_sift_attention_configs")
    if configs is None:
        from transformers import PreTrainedModel

        found = {id(model.config): model.config}
        for m in model.modules():
            if isinstance(m, PreTrainedModel):
                found.setdefault(id(m.config), m.config)
        configs = model.__dict__["_sift_attention_configs"] = list(found.values())
    return configs


@contextlib.contextmanager
def swapped_attention(model, name: str, fn: Callable | None = None, local: threading.local | None = None,
                      **values) -> Iterator[None]:
    """Inside the block every attention layer of `model` runs `fn` (registered as `name`), or the built-in
    implementation `name` ("sdpa", "eager") when `fn` is None; `values` are set on `local` for the block and
    reset to None after it.

    transformers checks an implementation the first time a model switches to it (`set_attn_implementation`, which
    walks every module: about a millisecond); later switches set the configs' implementation directly, so a swap
    costs microseconds inside timed prefills."""
    if fn is not None:
        # imported here: transformers is already loaded by whoever built the model, and importing it costs
        # seconds to every module that imports this one
        from transformers import AttentionInterface

        AttentionInterface.register(name, fn)
    configs = _attention_configs(model)
    previous = [c._attn_implementation_internal for c in configs]
    checked = model.__dict__.setdefault("_sift_checked_attention", set())
    if name in checked:
        for c in configs:
            c._attn_implementation_internal = name
    else:
        model.set_attn_implementation(name)
        checked.add(name)
    try:
        for key, value in values.items():
            setattr(local, key, value)
        try:
            yield
        finally:
            for key in values:
                setattr(local, key, None)
    finally:
        for c, p in zip(configs, previous):
            c._attn_implementation_internal = p
