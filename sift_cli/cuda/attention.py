"""The Hopper (sm_90a) block-sparse attention forward of kernels/sparse_attn_fwd.cu: its configurations, their
shared memory and compile-time defines, and the compiled kernel of each (the launch is `plan.py`'s, the per-prompt
work order `work_order.py`'s).

Configurations: head_dim 64 or 128; KV blocks of the table 64 or 128 keys wide; query blocks of 128 rows (two
consumer warpgroups in pingpong, one CTA per SM) or 64 rows (one consumer warpgroup, two CTAs per SM). A table of
64-key blocks runs `paired` by default (each pipeline step gathers two listed 64-key blocks, any rows, into one
128-key tile), except with 64-row query blocks at head_dim 128, where a paired ring would not leave room for a
second CTA on the SM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SiftError
from .runtime import compiled_module, function_ptr, resident_ctas, sm_count

BLOCK_MS = (64, 128)
HEAD_DIMS = (64, 128)
BLOCK_NS = (64, 128)
MAX_SMEM = 227 * 1024  # dynamic shared memory a Hopper CTA can have
SM_SMEM = 228 * 1024  # shared memory of one SM, 1 KiB of it reserved per resident CTA
TILE_SLOTS = 3  # tiles whose lists the kernel's scheduler stages ahead (kernel macro TILE_SLOTS)


@dataclass(frozen=True)
class KernelConfig:
    head_dim: int
    block_n: int  # keys per pipeline step (the compute tile)
    pair: bool  # two 64-key table blocks per step
    stages: int
    block_m: int = 128  # query rows per tile: 64 per consumer warpgroup

    @property
    def key_block(self) -> int:
        """Width of the table's KV blocks."""
        return self.block_n // 2 if self.pair else self.block_n

    @property
    def per_step(self) -> int:
        return 2 if self.pair else 1

    @property
    def threads(self) -> int:
        return 128 * (1 + self.block_m // 64)  # the producer warpgroup and one consumer warpgroup per 64 rows


def paired(table_block_n: int, pair: bool | None = None, head_dim: int = 128, block_m: int = 128) -> bool:
    """Whether a pipeline step gathers two 64-key table blocks: by default when the table's blocks are 64, except
    for 64-row query blocks at head_dim 128 (two CTAs per SM need the smaller ring)."""
    if pair is not None:
        return pair
    return table_block_n == 64 and not (block_m == 64 and head_dim == 128)


def kernel_config(head_dim: int, table_block_n: int, pair: bool | None = None,
                  stages: int | None = None, block_m: int = 128) -> KernelConfig:
    if head_dim not in HEAD_DIMS:
        raise SiftError(f"the cuda backend supports head_dim 64 and 128, not {head_dim}")
    if table_block_n not in BLOCK_NS:
        raise SiftError(f"the cuda backend supports KV blocks of 64 and 128, not {table_block_n}")
    if block_m not in BLOCK_MS:
        raise SiftError(f"the cuda backend supports query blocks of 64 and 128 rows, not {block_m}")
    pair = paired(table_block_n, pair, head_dim, block_m)
    if pair and table_block_n != 64:
        raise SiftError("paired steps gather two 64-key blocks; the table has blocks of 128")
    block_n = 128 if pair else table_block_n
    # Ring depth measured on the H200 (docs/kernels.md); two stages keep two 64-row CTAs on an SM.
    stages = stages or (3 if (head_dim == 128 and block_n == 64 and block_m == 128) else 2)
    return KernelConfig(head_dim, block_n, pair, stages, block_m)


def persistent_ctas(cfg: KernelConfig, list_cap: int, device: torch.device, extra: dict | None = None) -> int:
    """The launch's persistent CTAs: one per SM, or for 64-row query blocks as many as the driver keeps resident
    (two when their shared memory fits; the kernel's registers are budgeted for two)."""
    if cfg.block_m == 128:
        return sm_count(device)
    func, smem = attention_function(cfg, device.index, list_cap, extra)
    return sm_count(device) * max(1, min(2, resident_ctas(func, cfg.threads, smem)))


def attention_smem_bytes(cfg: KernelConfig, list_cap: int, tile_slots: int = TILE_SLOTS) -> int:
    q = 2 * cfg.block_m * cfg.head_dim * 2  # two Q buffers
    kv = 2 * cfg.stages * cfg.block_n * cfg.head_dim * 2
    barriers = 8 * (4 + 4 * cfg.stages + 2 * tile_slots)
    slots = 16 + tile_slots * 32 + 16  # alignment, the tile slots, the split-KV flag
    return 1024 + q + kv + barriers + slots + tile_slots * 4 * list_cap  # staged lists of packed 4-byte entries


def attention_defines(cfg: KernelConfig, list_cap: int, extra: dict | None = None
                      ) -> tuple[tuple[tuple[str, int], ...], int]:
    """(the kernel's compile-time defines, dynamic shared memory bytes) for one configuration and a prompt of
    `list_cap` KV blocks; `extra` defines (diagnostic builds, variants) go in too."""
    defines = (("HEAD_DIM", cfg.head_dim), ("BLOCK_N", cfg.block_n), ("STAGES", cfg.stages),
               ("PAIR", int(cfg.pair)), ("BLOCK_M", cfg.block_m))
    extra = dict(extra or {})
    if "TILE_SLOTS" not in extra and attention_smem_bytes(cfg, list_cap) > MAX_SMEM:
        extra["TILE_SLOTS"] = 2  # a prompt this long stages one tile fewer ahead rather than fail
    defines += tuple(sorted(extra.items()))
    smem = attention_smem_bytes(cfg, list_cap, extra.get("TILE_SLOTS", TILE_SLOTS))
    if smem > MAX_SMEM:
        raise SiftError(f"the prompt's {list_cap} KV blocks need {smem} bytes of shared memory, more than the GPU "
                        "has; use KV blocks of 128 (--block-n 128) for prompts this long")
    return defines, smem


def attention_function(cfg: KernelConfig, device_index: int, list_cap: int, extra: dict | None = None
                       ) -> tuple[int, int]:
    """(CUfunction, dynamic shared memory bytes) for one configuration, compiled once per process."""
    defines, smem = attention_defines(cfg, list_cap, extra)
    key = (defines, device_index)
    func = _FUNCTIONS.get(key)
    if func is None:  # compiled once per process; its shared-memory limit raised once, to what the GPU allows
        mod = compiled_module("sparse_attn_fwd.cu", defines, device_index)
        func = _FUNCTIONS[key] = function_ptr(mod, "sift_sparse_attn_fwd", MAX_SMEM)
    return func, smem


_FUNCTIONS: dict = {}
