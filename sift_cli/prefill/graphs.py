"""A prefill captured once per prompt as a CUDA graph (copy of its inputs, decode and forward; static shapes) and
replayed: full recompute, or SIFT. Each graph copies the prompt's inputs (its ids; SIFT's bits too) from a pinned
host buffer that each replay restages first."""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from ..attention.integration import causal_attention, sparse_attention
from ..device_copy import StagedCopy
from ..models import LoadedModel
from .assemble import Prompt
from .options import PrefillOptions
from .plan import prepare_sparse, prompt_block_table, untimed_plan
from .run import run_forward, strongest_sdpa, sync_device


@contextlib.contextmanager
def _graphed_dense(lm: LoadedModel):
    """Full recompute's attention for a graph capture: the strongest SDPA, called causally as eager runs it
    (`causal_attention`), unless a caller swapped in an attention function of its own (a benchmark's stand-in)."""
    with strongest_sdpa(lm.device), (causal_attention(lm.model) if lm.model.config._attn_implementation == "sdpa"
                                     else contextlib.nullcontext()):
        yield


class GraphedPrefill:
    """One mode's prefill of one prompt captured as a CUDA graph (copy of its inputs, decode and forward; static
    shapes). The graph copies the prompt's inputs from a pinned host buffer (one `StagedCopy`): its token ids and
    `host_inputs` (SIFT's bits), which `sparse_setup(views)` reads on the device. `replay()` restages them there
    (the per-prompt host work, so replay timings include it) and replays; it returns (logits, past) computed
    again. With `fetch` (a callable returning new `host_inputs`: SIFT's bits looked up in the prompt's sets) each
    replay fetches them first, so its time counts the lookup too. `capture_ms` is what building it cost;
    `lookup_ms` the fetch alone and `transfer_ms` the host time of restaging alone (medians of `repeat`). With
    `stage_ids=False` the ids stay on the device as captured (for comparisons)."""

    def __init__(self, lm: LoadedModel, ids: torch.Tensor, sparse_setup=None, host_inputs=(), repeat: int = 1,
                 stage_ids: bool = True, fetch=None):
        self.lm = lm
        self._fetch = fetch
        t0 = time.perf_counter()
        self._ids_host = [ids.cpu()] if stage_ids else []
        self._host = self._ids_host + list(host_inputs)
        self.staged = StagedCopy(self._host, lm.device) if self._host else None
        views = self.staged.views if self.staged is not None else []
        self.ids = views[0] if stage_ids else ids.clone()
        inputs = views[1:] if stage_ids else views

        def step():
            if self.staged is not None:
                self.staged.copy()
            if sparse_setup is None:
                return run_forward(lm, self.ids, _graphed_dense(lm)) + (None,)
            plan = sparse_setup(inputs)
            return run_forward(lm, self.ids, sparse_attention(lm.model, plan)) + (plan,)

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
        lookups, times = [], []
        for _ in range(max(1, repeat)):
            lookups.append(self.lookup())
            t0 = time.perf_counter()
            self.stage(fetched=False)
            times.append((time.perf_counter() - t0) * 1e3)
        self.lookup_ms = statistics.median(lookups)
        self.transfer_ms = statistics.median(times) if self.staged is not None else 0.0

    def lookup(self) -> float:
        """Fetch the prompt's host inputs again (with `fetch`); returns the milliseconds it took."""
        if self._fetch is None:
            return 0.0
        t0 = time.perf_counter()
        self._host = self._ids_host + list(self._fetch())
        return (time.perf_counter() - t0) * 1e3

    def stage(self, fetched: bool = True) -> None:
        """Restage the prompt's inputs in the pinned buffer the graph's copy reads (host work only), looked up
        again first unless `fetched` is False."""
        if fetched:
            self.lookup()
        if self.staged is not None:
            self.staged.stage(self._host)

    def replay(self) -> tuple[torch.Tensor, object]:
        self.stage()
        self.graph.replay()
        return self.logits, self.past


def graphed_sparse_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, opts: PrefillOptions,
                           decoder: str, repeat: int = 1, stage_ids: bool = True) -> GraphedPrefill:
    """SIFT's prefill of `prompt` captured as a graph that copies the ids and bits to the device (one
    `StagedCopy`), decodes the bits and runs the forward; each replay looks the bits up again in the prompt's sets
    and restages both (`GraphedPrefill`). The block
    table is not restaged: it follows from the prompt's layout, which a graph is fixed to anyway (its shapes, and
    the decode's scalar arguments, are captured), so it is moved once. A prompt without bits captures full
    recompute's forward (as `run._causal_prefill`) and has its `plan` decoded apart, for the report."""
    if prompt.bits.without_bits():
        graph = GraphedPrefill(lm, ids, repeat=repeat, stage_ids=stage_ids)
        graph.plan = untimed_plan(lm, prompt, backend, opts, decoder)
        return graph
    table = prompt_block_table(prompt, opts).to(lm.device)

    def setup(bits_on_device):
        return prepare_sparse(lm, prompt.bits.with_tensors(bits_on_device), table, backend, decoder)

    fetch = (lambda: prompt.source.fetch().tensors()) if prompt.source is not None else None
    return GraphedPrefill(lm, ids, setup, prompt.bits.tensors(), repeat, stage_ids, fetch)
