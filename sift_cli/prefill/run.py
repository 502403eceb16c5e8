"""One prefill of a prompt on the loaded model: full recompute, or SIFT from the prompt's bit vectors.

SIFT's time to first token counts fetching the prompt's bit vectors from its shard sets (the store lookup),
moving them to the device, decoding every layer's block lists (and the backend's own preparation) and the
forward, timed as one piece from an idle device (the CUDA decoder runs on a side stream, beside the forward's
start). Each prefill is timed three ways: wall time, host time
(until Python has enqueued the whole forward) and GPU time (CUDA events), so a report shows whether a run is
bound by the host or by the GPU. `graphs` captures a prefill as a CUDA graph; `report.run_prefill` runs both
modes side by side.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..attention.integration import SparsePlan, sparse_attention
from ..models import LoadedModel
from .assemble import Prompt
from .options import PrefillOptions, for_prompt
from .plan import prepare_sparse, prompt_tensors, untimed_plan


def sync_device(device) -> None:
    """Wait for the device's queued work (timings that include the GPU's time); a no-op off CUDA."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def strongest_sdpa(device: torch.device):
    """Full recompute at its fastest on this device: SDPA tries cuDNN first, then flash, then memory-efficient
    (PyTorch's own order can land on a slower kernel), the same dense baseline `sift bench` pins."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # a torch without priorities: the same backends, its own order
        return sdpa_kernel(order)


@dataclass
class Timing:
    wall_ms: float
    host_ms: float  # until the forward was enqueued (equals wall on a CPU)
    gpu_ms: float | None  # CUDA-event time of the forward (None on a CPU)


@dataclass
class ForwardRun:
    logits: torch.Tensor  # fp32 [vocab] at the last position
    past: object
    timing: Timing


def run_forward(lm: LoadedModel, ids: torch.Tensor, context) -> tuple[torch.Tensor, object]:
    with context:
        out = lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1], out.past_key_values


@torch.inference_mode()
def timed(lm: LoadedModel, fn) -> tuple[object, Timing]:
    """Run fn() (which enqueues device work) and time it: wall, host (enqueue) and GPU (events)."""
    dev = lm.device
    if dev.type != "cuda":
        t0 = time.perf_counter()
        result = fn()
        ms = (time.perf_counter() - t0) * 1e3
        return result, Timing(ms, ms, None)
    sync_device(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    result = fn()
    end.record()
    t1 = time.perf_counter()
    end.synchronize()
    t2 = time.perf_counter()
    return result, Timing((t2 - t0) * 1e3, (t1 - t0) * 1e3, start.elapsed_time(end))


@dataclass
class SparseRun:
    """One eager SIFT prefill, timed as one piece from an idle device: the lookup of the prompt's bits in its shard
    sets, their transfer, the decode of every layer (on a side stream with the CUDA decoder, overlapping the
    forward) and the forward."""

    logits: torch.Tensor
    past: object
    timing: Timing  # the whole prefill: its wall time is the time to first token
    transfer_ms: float  # host time to move the bits and the block table (enqueue, on a GPU)
    prepare_ms: float  # host time to decode every layer and prepare the backend (enqueue, on a GPU)
    plan: SparsePlan = field(repr=False)
    lookup_ms: float = 0.0  # fetching the bits from the prompt's sets (0 for bits given in memory)

    @property
    def ttft_ms(self) -> float:
        return self.timing.wall_ms

    @property
    def forward_ms(self) -> float:
        """The rest of the time to first token: the forward, and on a GPU what the decode adds to it."""
        return self.timing.wall_ms - self.lookup_ms - self.transfer_ms - self.prepare_ms


@torch.inference_mode()
def dense_prefill(lm: LoadedModel, ids: torch.Tensor) -> ForwardRun:
    (logits, past), t = timed(lm, lambda: run_forward(lm, ids, strongest_sdpa(lm.device)))
    return ForwardRun(logits.float(), past, t)


@torch.inference_mode()
def sparse_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, opts: PrefillOptions,
                   decoder: str = "torch") -> SparseRun:
    opts = for_prompt(opts, backend, lm.head_dim, prompt.bits)
    if prompt.bits.without_bits():
        return _causal_prefill(lm, prompt, backend, ids, opts, decoder)
    marks = []

    def run():
        marks.append(time.perf_counter())
        fetched = prompt.source.fetch() if prompt.source is not None else prompt.bits  # the store lookup
        marks.append(time.perf_counter())
        bits, table = prompt_tensors(prompt, opts, lm.device, fetched)
        marks.append(time.perf_counter())
        plan = prepare_sparse(lm, bits, table, backend, decoder)
        marks.append(time.perf_counter())
        return run_forward(lm, ids, sparse_attention(lm.model, plan)), plan

    ((logits, past), plan), t = timed(lm, run)
    ms = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
    return SparseRun(logits.float(), past, t, ms[1], ms[2], plan, lookup_ms=ms[0])


def _causal_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, opts: PrefillOptions,
                    decoder: str) -> SparseRun:
    """A prompt whose documents have no bits: SIFT's mask is the causal mask, so full recompute's own kernel
    computes it, with nothing to move or decode first. The lists (every causal block) are decoded after the timed
    run, for the report. Graphed, the same holds (`graphs.graphed_sparse_prefill`)."""
    full = dense_prefill(lm, ids)
    return SparseRun(full.logits, full.past, full.timing, 0.0, 0.0, untimed_plan(lm, prompt, backend, opts, decoder))
