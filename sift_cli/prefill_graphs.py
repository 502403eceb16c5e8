"""A prefill captured once per prompt as a CUDA graph (decode and forward; static shapes) and replayed: full
recompute, or SIFT from the prompt's bits and block table already on the device."""

from __future__ import annotations

import contextlib
import time

import torch

from .attention.integration import causal_attention, sparse_attention
from .models import LoadedModel
from .prefill import PrefillOptions, _forward, prepare_sparse, prompt_table, strongest_sdpa, sync_device
from .prompt import Prompt


@contextlib.contextmanager
def _graphed_dense(lm: LoadedModel):
    """Full recompute's attention for a graph capture: the strongest SDPA, called causally as eager runs it
    (`causal_attention`), unless a caller swapped in an attention function of its own (a benchmark's stand-in)."""
    with strongest_sdpa(lm.device), (causal_attention(lm.model) if lm.model.config._attn_implementation == "sdpa"
                                     else contextlib.nullcontext()):
        yield


class GraphedPrefill:
    """One mode's prefill of one prompt captured as a CUDA graph (decode and forward; static shapes): `replay()`
    returns (logits, past) computed again; `capture_ms` is what building it cost; `transfer_ms` what each replay
    adds before it (`graphed_sparse_prefill`: moving SIFT's bits and block table to the device)."""

    def __init__(self, lm: LoadedModel, ids: torch.Tensor, sparse_setup=None):
        self.lm = lm
        self.ids = ids.clone()
        self.transfer_ms = 0.0
        t0 = time.perf_counter()

        def step():
            if sparse_setup is None:
                return _forward(lm, self.ids, _graphed_dense(lm)) + (None,)
            plan = sparse_setup()
            return _forward(lm, self.ids, sparse_attention(lm.model, plan)) + (plan,)

        side = torch.cuda.Stream(lm.device)
        side.wait_stream(torch.cuda.current_stream(lm.device))
        with torch.inference_mode(), torch.cuda.stream(side):
            step()  # warm up outside the graph: compilation, autotuning, allocator pools
        torch.cuda.current_stream(lm.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.logits, self.past, self.plan = step()
        sync_device(lm.device)
        self.capture_ms = (time.perf_counter() - t0) * 1e3

    def replay(self) -> tuple[torch.Tensor, object]:
        self.graph.replay()
        return self.logits, self.past


def graphed_sparse_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, opts: PrefillOptions,
                           decoder: str, repeat: int = 1) -> GraphedPrefill:
    """SIFT's prefill of `prompt` captured as a graph, its `transfer_ms` the median of `repeat` moves of the bits
    and block table (`prefill.prompt_table`). A prompt without bits captures full recompute's forward (as
    `prefill._causal_prefill`), adds no transfer, and has its `plan` decoded apart, for the report."""
    no_bits = prompt.bits.without_bits()
    bits, table, transfer_ms = prompt_table(prompt, opts, lm.device, 1 if no_bits else repeat)
    if no_bits:
        graph = GraphedPrefill(lm, ids)
        graph.plan = prepare_sparse(lm, bits, table, backend, decoder)
        return graph
    graph = GraphedPrefill(lm, ids, lambda: prepare_sparse(lm, bits, table, backend, decoder))
    graph.transfer_ms = transfer_ms
    return graph
