"""One prefill of a prompt on the loaded model: full recompute, or SIFT from the prompt's bit vectors.

SIFT's time to first token counts moving the prompt's bit vectors to the device, decoding every layer's block
lists (and the backend's own preparation) and the forward, timed as one piece from an idle device (the CUDA
decoder runs on a side stream, beside the forward's start). Each prefill is timed three ways: wall time, host time
(until Python has enqueued the whole forward) and GPU time (CUDA events), so a report shows whether a run is
bound by the host or by the GPU. `prefill_graphs` captures a prefill as a CUDA graph; `prefill_report.run_prefill`
runs both modes side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention.base import BlockLists
from .attention.cuda import CudaBackend
from .attention.integration import SparsePlan, prepare_plan, sparse_attention
from .block_lists import decode_layers
from .block_table import BlockTable
from .cuda.coalesce import KernelLists
from .cuda.decode import CudaDecoder, DecodedLayers
from .device_copy import to_device
from .errors import SiftError
from .layout import PromptBits
from .models import LoadedModel
from .prompt import Prompt


DEFAULT_BLOCK_M = 128


@dataclass(frozen=True)
class PrefillOptions:
    backend: str = "auto"
    block_m: int | None = None  # query block rows; None: the backend's (`for_backend`)
    block_n: int = 64
    query_blocks: str = "auto"  # "segment", "grid" (block_table.py) or "auto" (the backend's, `for_backend`)
    cuda_graphs: bool = False
    repeat: int | None = None  # timed runs of each mode; None: the device's default (`timing_defaults`)
    warmup: int | None = None  # untimed runs of each mode first; None: the device's default
    max_new_tokens: int = 16


def timing_defaults(device) -> dict:
    """Timed runs and warm-ups of each mode when the caller does not set them: on a GPU the median of 3 runs after
    1 warm-up (compilation, autotuning and allocation stay out of the timings); on a CPU 1 run and no warm-up, as
    nothing there needs one and a forward of a long prompt takes minutes (its timings check, they do not
    benchmark)."""
    if torch.device(device).type == "cuda":
        return {"repeat": 3, "warmup": 1}
    return {"repeat": 1, "warmup": 0}


def with_device_defaults(opts: PrefillOptions, device) -> PrefillOptions:
    """`opts` with the unset timing fields (repeat, warmup) filled in for `device`."""
    d = timing_defaults(device)
    return dataclasses.replace(opts, repeat=d["repeat"] if opts.repeat is None else opts.repeat,
                               warmup=d["warmup"] if opts.warmup is None else opts.warmup)


def for_backend(opts: PrefillOptions, backend, head_dim: int, seq_len: int, dense_share: float = 0.0,
                selected_share: float = 0.0) -> PrefillOptions:
    """`opts` with an unset query block size set to the one the backend runs this prompt best with (its
    `query_block_rows`: the CUDA kernel's 64 or 128, the gather backend's 512), or 128 rows, and "auto" query
    blocks to the backend's cut for the prompt (its `query_block_cut`), or "segment". dense_share: the prompt's
    share of document tokens without bits (`PromptBits.dense_share`); selected_share: the share of its tiles and
    pages selected (`PromptBits.selected_share`)."""
    if opts.query_blocks == "auto":
        cut = getattr(backend, "query_block_cut", None)
        opts = dataclasses.replace(opts, query_blocks=cut(selected_share) if cut else "segment")
    if opts.block_m is not None:
        return opts
    rows = getattr(backend, "query_block_rows", None)
    return dataclasses.replace(opts, block_m=rows(head_dim, seq_len, dense_share) if rows else DEFAULT_BLOCK_M)


def for_prompt(opts: PrefillOptions, backend, head_dim: int, bits: PromptBits) -> PrefillOptions:
    """`for_backend` for the prompt whose bits are `bits` (their shares counted only for a choice still open)."""
    selected = bits.selected_share() if opts.query_blocks == "auto" else 0.0
    dense = bits.dense_share() if opts.block_m is None else 0.0
    return for_backend(opts, backend, head_dim, bits.layout.seq_len, dense, selected)


def sync_device(device) -> None:
    """Wait for the device's queued work (timings that include the GPU's time); a no-op off CUDA."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def choose_decoder(device: torch.device) -> str:
    """The CUDA decode kernel wherever it can run (any backend reads its lists), else the PyTorch decoder."""
    if device.type != "cuda":
        return "torch"
    return "cuda" if CudaBackend.available(device)[0] else "torch"


def decode_all_layers(bits: PromptBits, table: BlockTable, n_layers: int, decoder: str = "torch", spec=None
                      ) -> tuple[Sequence[BlockLists], tuple | None]:
    """Every layer's CSR lists over `table` (bits already on the device), and, from the CUDA decoder, the stacked
    (offsets, indices, tiles) of all layers; tiles: the attention kernel's lists and work order
    (`cuda.coalesce.KernelLists`) when `spec` (a cuda.decode.WorkSpec) asks for them, else None. The CUDA decoder
    never waits for the device."""
    if decoder == "cuda":
        dec = CudaDecoder(bits, table, layers=range(n_layers))
        tiles = KernelLists(dec.offsets, dec.indices, dec.table, spec) if spec is not None else None
        return DecodedLayers(dec), (dec.offsets, dec.indices, tiles)
    return decode_layers(bits, table, n_layers), None


_SIDE_STREAMS: dict = {}


def prepare_sparse(lm: LoadedModel, bits: PromptBits, table: BlockTable, backend, decoder: str) -> SparsePlan:
    """Decode every layer and let the backend prepare its per-prompt form, with no device synchronisation. The
    CUDA decoder runs on a side stream: the forward's first sparse layer waits for it, so the decode overlaps
    the embedding and the first layer's projections instead of adding to the time to first token."""
    if decoder != "cuda" or not getattr(backend, "waits_for_ready", False):
        block_lists, stacked = decode_all_layers(bits, table, lm.n_layers, decoder)
        return prepare_plan(backend, table, block_lists, stacked)
    dev = lm.device
    main = torch.cuda.current_stream(dev)
    side = _SIDE_STREAMS.get(dev)
    if side is None:
        side = _SIDE_STREAMS[dev] = torch.cuda.Stream(dev)
    # The side stream first waits for everything queued on the main one, so memory it allocates here and frees
    # later is only reused by side-stream work that starts after the forward that read it.
    side.wait_stream(main)
    ready = torch.cuda.Event()  # recorded after all the side stream's work: the first sparse layer waits for it
    with torch.cuda.stream(side):
        spec = backend.work_spec(table, dev, lm.head_dim)
        block_lists, stacked = decode_all_layers(bits, table, lm.n_layers, decoder, spec)
        plan = prepare_plan(backend, table, block_lists, stacked, ready)
        ready.record(side)
    return plan


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


def _forward(lm: LoadedModel, ids: torch.Tensor, context) -> tuple[torch.Tensor, object]:
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
    """One eager SIFT prefill, timed as one piece from an idle device: the bits' transfer, the decode of every
    layer (on a side stream with the CUDA decoder, overlapping the forward) and the forward."""

    logits: torch.Tensor
    past: object
    timing: Timing  # the whole prefill: its wall time is the time to first token
    transfer_ms: float  # host time to move the bits and the block table (enqueue, on a GPU)
    prepare_ms: float  # host time to decode every layer and prepare the backend (enqueue, on a GPU)
    plan: SparsePlan = field(repr=False)

    @property
    def ttft_ms(self) -> float:
        return self.timing.wall_ms

    @property
    def forward_ms(self) -> float:
        """The rest of the time to first token: the forward, and on a GPU what the decode adds to it."""
        return self.timing.wall_ms - self.transfer_ms - self.prepare_ms


@torch.inference_mode()
def dense_prefill(lm: LoadedModel, ids: torch.Tensor) -> ForwardRun:
    (logits, past), t = timed(lm, lambda: _forward(lm, ids, strongest_sdpa(lm.device)))
    return ForwardRun(logits.float(), past, t)


def prompt_block_table(prompt: Prompt, opts: PrefillOptions) -> BlockTable:
    """The prompt's block table, built on the host."""
    if opts.block_m is None:
        raise SiftError("internal: the query block size is unset; resolve the options with for_backend first")
    if opts.query_blocks == "auto":
        raise SiftError("internal: the query blocks are unresolved; resolve the options with for_backend first")
    return BlockTable.for_layout(prompt.layout, opts.block_m, opts.block_n, opts.query_blocks)


def prompt_tensors(prompt: Prompt, opts: PrefillOptions, device) -> tuple[PromptBits, BlockTable]:
    """The prompt's bits (every layer's) and block table on the device, the small tensors of both in one copy."""
    bits, table = prompt.bits, prompt_block_table(prompt, opts)
    moved = to_device(bits.tensors() + table.tensors(), device)
    return bits.with_tensors(moved[: len(bits.TENSORS)]), table.with_tensors(moved[len(bits.TENSORS):])


@torch.inference_mode()
def sparse_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, opts: PrefillOptions,
                   decoder: str = "torch") -> SparseRun:
    opts = for_prompt(opts, backend, lm.head_dim, prompt.bits)
    if prompt.bits.without_bits():
        return _causal_prefill(lm, prompt, backend, ids, opts, decoder)
    marks = []

    def run():
        marks.append(time.perf_counter())
        bits, table = prompt_tensors(prompt, opts, lm.device)
        marks.append(time.perf_counter())
        plan = prepare_sparse(lm, bits, table, backend, decoder)
        marks.append(time.perf_counter())
        return _forward(lm, ids, sparse_attention(lm.model, plan)), plan

    ((logits, past), plan), t = timed(lm, run)
    return SparseRun(logits.float(), past, t, (marks[1] - marks[0]) * 1e3, (marks[2] - marks[1]) * 1e3, plan)


def _causal_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, opts: PrefillOptions,
                    decoder: str) -> SparseRun:
    """A prompt whose documents have no bits: SIFT's mask is the causal mask, so full recompute's own kernel
    computes it, with nothing to move or decode first. The lists (every causal block) are decoded after the timed
    run, for the report. Graphed, the same holds (`prefill_graphs.graphed_sparse_prefill`)."""
    full = dense_prefill(lm, ids)
    return SparseRun(full.logits, full.past, full.timing, 0.0, 0.0, untimed_plan(lm, prompt, backend, opts, decoder))


def untimed_plan(lm: LoadedModel, prompt: Prompt, backend, opts: PrefillOptions, decoder: str) -> SparsePlan:
    """The prompt's bits moved and every layer decoded outside any timing: the lists a report describes when the
    forward did not need them (a prompt without bits runs full recompute's kernel)."""
    bits, table = prompt_tensors(prompt, opts, lm.device)
    return prepare_sparse(lm, bits, table, backend, decoder)
