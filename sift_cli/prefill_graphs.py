"""A prefill captured once per prompt as a CUDA graph (decode and forward; static shapes) and replayed: full
recompute, or SIFT from the prompt's bits and block table already on the device."""

from __future__ import annotations

import contextlib
import time

import torch

from .attention.integration import causal_attention, sparse_attention
from .block_table import BlockTable
from .layout import PromptBits
from .models import LoadedModel
from .prefill import PrefillOptions, _forward, lists_for_report, prepare_sparse, strongest_sdpa, sync_device
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
    returns (logits, past) computed again; `capture_ms` is what building it cost."""

    def __init__(self, lm: LoadedModel, ids: torch.Tensor, sparse_setup=None):
        self.lm = lm
        self.ids = ids.clone()
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
                           bits: PromptBits, table: BlockTable, decoder: str) -> GraphedPrefill:
    """SIFT's prefill of `prompt` (its bits and table on the device) captured as a graph; for a prompt without bits,
    full recompute's forward (as `_causal_prefill`), its `plan` decoded apart for the report."""
    if prompt.bits.without_bits():
        graph = GraphedPrefill(lm, ids)
        graph.plan = lists_for_report(lm, prompt, backend, opts, decoder)
        return graph
    return GraphedPrefill(lm, ids, lambda: prepare_sparse(lm, bits, table, backend, decoder))
