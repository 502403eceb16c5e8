"""A prefill captured once per prompt as a CUDA graph (decode and forward; static shapes) and replayed: full
recompute, or SIFT, whose graph also copies the prompt's bits from a pinned host buffer that each replay restages
first."""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from .attention.integration import causal_attention, sparse_attention
from .device_copy import StagedCopy
from .models import LoadedModel
from .prefill import (PrefillOptions, _forward, prepare_sparse, prompt_block_table, strongest_sdpa, sync_device,
                      untimed_plan)
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
    runs `before_replay()` (host work each replay needs first, e.g. restaging the graph's inputs) and the graph,
    and returns (logits, past) computed again; `capture_ms` is what building it cost; `transfer_ms` the host time
    of `before_replay` alone, part of each replay's (`graphed_sparse_prefill`: staging SIFT's bits)."""

    def __init__(self, lm: LoadedModel, ids: torch.Tensor, sparse_setup=None, before_replay=None):
        self.lm = lm
        self.ids = ids.clone()
        self.before_replay = before_replay
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
        if self.before_replay is not None:
            self.before_replay()
        self.graph.replay()
        return self.logits, self.past


def graphed_sparse_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, opts: PrefillOptions,
                           decoder: str, repeat: int = 1) -> GraphedPrefill:
    """SIFT's prefill of `prompt` captured as a graph that copies the bits to the device (one `StagedCopy`, the
    graph's `staged`), decodes them and runs the forward. Each replay first stages the prompt's bits into the
    copy's pinned buffer, the per-prompt host work, so replay timings include it; `transfer_ms` is that staging
    alone, the median of `repeat`. The block table is not restaged: it follows from the prompt's layout, which a
    graph is fixed to anyway (its shapes, and the decode's scalar arguments, are captured), so it is moved once.
    A prompt without bits captures full recompute's forward (as `prefill._causal_prefill`), stages nothing, and
    has its `plan` decoded apart, for the report."""
    if prompt.bits.without_bits():
        graph = GraphedPrefill(lm, ids)
        graph.plan = untimed_plan(lm, prompt, backend, opts, decoder)
        return graph
    table = prompt_block_table(prompt, opts).to(lm.device)
    staged = StagedCopy(prompt.bits.tensors(), lm.device)
    bits = prompt.bits.with_tensors(staged.views)

    def stage():
        staged.stage(prompt.bits.tensors())

    def setup():
        staged.copy()
        return prepare_sparse(lm, bits, table, backend, decoder)

    graph = GraphedPrefill(lm, ids, setup, stage)
    graph.staged = staged
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        stage()
        times.append((time.perf_counter() - t0) * 1e3)
    graph.transfer_ms = statistics.median(times)
    return graph
