"""The Hopper (sm_90a) block-sparse attention forward of kernels/sparse_attn_fwd.cu (TMA + mbarrier ring +
warp-specialised WGMMA): configurations, shared memory, argument checks and the launch.

`sparse_attention_forward(q, k, v, blocks, scale, return_lse)` computes what `attention.reference` computes, in
bf16; an unsupported shape or dtype is a SiftError, never a silent fallback.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..attention.base import BlockLists
from ..errors import SiftError
from .runtime import check_device, compiled_module, launch, tensor_map_bf16_3d

BLOCK_M = 128
ATTN_THREADS = 384
HEAD_DIMS = (64, 128)
BLOCK_NS = (64, 128)


def default_stages(head_dim: int, block_n: int) -> int:
    """Ring depth per configuration (measured on the H200, docs/kernels.md)."""
    return 3 if (head_dim == 128 and block_n == 64) else 2


def attention_smem_bytes(head_dim: int, block_n: int, stages: int) -> int:
    q = BLOCK_M * head_dim * 2
    kv = block_n * head_dim * 2
    return q + 2 * stages * kv + 8 * (2 + 4 * stages) + 1024  # + barriers + slack for 1024-byte alignment


def attention_kernel(head_dim: int, block_n: int, device_index: int, stages: int | None = None,
                     pingpong: bool = True, extra: dict | None = None):
    """(RawKernel, dynamic shared memory bytes) for one configuration, compiled once per process."""
    if head_dim not in HEAD_DIMS:
        raise SiftError(f"the cuda backend supports head_dim 64 and 128, not {head_dim}")
    if block_n not in BLOCK_NS:
        raise SiftError(f"the cuda backend supports KV blocks of 64 and 128, not {block_n}")
    stages = stages or default_stages(head_dim, block_n)
    defines = (("HEAD_DIM", head_dim), ("BLOCK_N", block_n), ("STAGES", stages), ("PINGPONG", int(pingpong)))
    defines += tuple(sorted((extra or {}).items()))
    mod = compiled_module("sparse_attn_fwd.cu", defines, device_index)
    kern = mod.get_function("sift_sparse_attn_fwd")
    smem = attention_smem_bytes(head_dim, block_n, stages)
    if kern.max_dynamic_shared_size_bytes < smem:
        kern.max_dynamic_shared_size_bytes = smem
    return kern, smem


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    ok = t.stride(-1) == 1 and all((s * 2) % 16 == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0
    return t if ok else t.contiguous()


def check_block_lists(blocks: BlockLists, H: int, L: int, device: torch.device) -> BlockLists:
    if blocks.block_m != BLOCK_M:
        raise SiftError(f"the cuda backend needs query blocks of {BLOCK_M} rows, the block lists have "
                        f"{blocks.block_m}")
    if blocks.block_n not in BLOCK_NS:
        raise SiftError(f"the cuda backend needs KV blocks of 64 or 128, the block lists have {blocks.block_n}")
    M = -(-L // BLOCK_M)
    if blocks.seq_len != L or tuple(blocks.offsets.shape) != (H, M + 1):
        raise SiftError(f"block lists are for H={blocks.n_heads}, L={blocks.seq_len}; attention has H={H}, L={L}")
    if blocks.offsets.dtype != torch.int32 or blocks.indices.dtype != torch.int32:
        raise SiftError("block list offsets and indices must be int32")
    if blocks.offsets.device != device or blocks.indices.device != device:
        blocks = blocks.to(device)
    if not (blocks.offsets.is_contiguous() and blocks.indices.is_contiguous()):
        blocks = BlockLists(blocks.offsets.contiguous(), blocks.indices.contiguous(), blocks.block_m,
                            blocks.block_n, blocks.seq_len)
    return blocks


def sparse_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists,
                             scale: float, return_lse: bool = False, out: torch.Tensor | None = None,
                             lse: torch.Tensor | None = None, stages: int | None = None, pingpong: bool = True,
                             persistent: bool = False, extra: dict | None = None):
    """Block-sparse causal attention: q [H, L, D], k/v [H_kv, L, D] bf16 → out [H, L, D] bf16 (+ lse [H, L]).

    Row (h, m) of `blocks` lists, in descending order, the KV blocks query block m of head h computes.
    persistent: launch one CTA per SM walking tiles round-robin instead of one CTA per tile (measured no faster
    with static round-robin, so off by default; see docs/kernels.md).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise SiftError(f"{name} must be [heads, seq_len, head_dim], got shape {tuple(t.shape)}")
        if t.dtype != torch.bfloat16:
            raise SiftError(f"the cuda backend computes in bf16; {name} is {t.dtype}")
        check_device(t, name)
    if not (q.device == k.device == v.device):
        raise SiftError("q, k and v must be on the same device")
    H, L, D = q.shape
    H_kv = k.shape[0]
    if tuple(k.shape) != (H_kv, L, D) or tuple(v.shape) != (H_kv, L, D):
        raise SiftError(f"k and v must be [{H_kv}, {L}, {D}], got {tuple(k.shape)} and {tuple(v.shape)}")
    if H_kv == 0 or H % H_kv:
        raise SiftError(f"query heads {H} are not a multiple of KV heads {H_kv}")
    if D not in HEAD_DIMS:
        raise SiftError(f"the cuda backend supports head_dim 64 and 128, not {D}")
    device = q.device
    blocks = check_block_lists(blocks, H, L, device)
    if out is None:
        out = torch.empty(H, L, D, dtype=torch.bfloat16, device=device)
    elif tuple(out.shape) != (H, L, D) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise SiftError("out must be a contiguous bf16 [H, L, D] tensor")
    if return_lse and lse is None:
        lse = torch.empty(H, L, dtype=torch.float32, device=device)
    if L == 0:
        return (out, lse) if return_lse else out
    kern, smem = attention_kernel(D, blocks.block_n, device.index, stages, pingpong, extra)
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    tq = tensor_map_bf16_3d(q, BLOCK_M)
    tk = tensor_map_bf16_3d(k, blocks.block_n)
    tv = tensor_map_bf16_3d(v, blocks.block_n)
    M = -(-L // BLOCK_M)
    lse_ptr = lse.data_ptr() if return_lse else out.data_ptr()
    args = (tq, tk, tv, out.data_ptr(), lse_ptr, blocks.offsets.data_ptr(), blocks.indices.data_ptr(),
            np.int32(L), np.int32(H), np.int32(H // H_kv), np.int32(M), np.float32(scale * math.log2(math.e)),
            np.int32(1 if return_lse else 0))
    tiles = H * M
    grid = min(tiles, _sm_count(device)) if persistent else tiles
    launch(kern, (grid, 1, 1), (ATTN_THREADS, 1, 1), args, smem, device)
    # keep the views alive until the launch is queued (their storage backs the TMA maps)
    del q, k, v
    return (out, lse) if return_lse else out
