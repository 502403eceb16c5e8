"""The options of one prefill (`PrefillOptions`) and how unset ones are resolved: timing by device, the query
block size and cut by backend and prompt."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .. import timing
from ..block_table import QUERY_BLOCKS
from ..errors import SiftError
from ..layout import PromptBits

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
    noise_floor: bool = True  # one more untimed full recompute in the reference precision (`noise`)


def timing_defaults(device, prompt_tokens: int | None = None) -> dict:
    """Timed runs and warm-ups of each mode when the caller does not set them (`timing.timing_defaults`: the warm
    median on a GPU and for short prompts on a CPU, else one cold run that prints no speed-up)."""
    return timing.timing_defaults(torch.device(device).type, prompt_tokens)


def with_device_defaults(opts: PrefillOptions, device, prompt_tokens: int | None = None) -> PrefillOptions:
    """`opts` with the unset timing fields (repeat, warmup) filled in for `device` and a prompt of that length.
    One set alone decides the other where it meets the timing rule (--repeat 3 alone warms up once, --warmup 1
    alone times 3 runs); below the rule a CPU takes the cold values (--repeat 1 alone: no warm-up), a GPU its
    defaults (a warm-up keeps compilation out of any timing)."""
    d = timing_defaults(device, prompt_tokens)
    gpu = torch.device(device).type == "cuda"
    if opts.repeat is not None and opts.warmup is None:
        d["warmup"] = timing.MIN_WARMUPS if opts.repeat >= timing.MIN_RUNS or gpu else 0
    if opts.warmup is not None and opts.repeat is None:
        d["repeat"] = timing.MIN_RUNS if opts.warmup >= timing.MIN_WARMUPS or gpu else 1
    return dataclasses.replace(opts, repeat=d["repeat"] if opts.repeat is None else opts.repeat,
                               warmup=d["warmup"] if opts.warmup is None else opts.warmup)


def forward_count(opts: PrefillOptions, device, prompt_tokens: int | None = None) -> int:
    """The forwards `report.run_prefill` runs on a prompt of that length: warm-ups and timed runs, of full
    recompute and of SIFT."""
    o = with_device_defaults(opts, device, prompt_tokens)
    return (max(0, o.warmup) + max(1, o.repeat)) * 2


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


def check_options(opts: PrefillOptions) -> None:
    if opts.block_n not in (64, 128) or opts.block_m not in (None, 64, 128, 192, 256, 512):
        raise SiftError("--block-n must be 64 or 128 and --block-m one of 64, 128, 192, 256, 512")
    for flag, value, least in (("--max-new-tokens", opts.max_new_tokens, 0), ("--repeat", opts.repeat, 1),
                               ("--warmup", opts.warmup, 0)):
        if value is not None and value < least:
            raise SiftError(f"{flag} {value}: must be at least {least}")
    if opts.query_blocks not in ("auto", *QUERY_BLOCKS):
        raise SiftError(f"--query-blocks must be one of auto, {', '.join(QUERY_BLOCKS)}, not {opts.query_blocks!r}")
