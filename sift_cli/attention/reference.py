"""Ground-truth block-sparse attention in plain PyTorch: dense scores, the block mask of SPEC §6, softmax.

Every other backend is checked against this one. Without LSE it runs the masked softmax through SDPA with a
boolean [H, L, L] mask in fp32; with LSE it materialises each head's [L, L] scores explicitly. Either way it is
for tests, CPU runs and modest lengths, not for speed.
"""

from __future__ import annotations

import torch

from .base import BlockLists


def expand_block_mask(blocks: torch.Tensor, block_m: int, block_n: int, seq_len: int) -> torch.Tensor:
    """Boolean [..., M, N] block mask → [..., L, L] token mask, intersected with causality."""
    mask = blocks.repeat_interleave(block_m, dim=-2)[..., :seq_len, :]
    mask = mask.repeat_interleave(block_n, dim=-1)[..., :seq_len]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=mask.device).tril()
    return mask & causal


def token_mask_from_layout(blocks: BlockLists) -> torch.Tensor:
    """Boolean [H, L, L]: listed blocks expanded to tokens, intersected with causality."""
    return expand_block_mask(blocks.dense_mask(), blocks.block_m, blocks.block_n, blocks.seq_len)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: BlockLists,
    scale: float,
    return_lse: bool = False,
    compute_dtype: torch.dtype = torch.float32,
):
    """q [H, L, D], k/v [H_kv, L, D] → out [H, L, D] (q's dtype), optionally lse [H, L] (fp32, natural log)."""
    H, L, D = q.shape
    H_kv = k.shape[0]
    if H % H_kv:
        raise ValueError(f"query heads {H} not a multiple of KV heads {H_kv}")
    if blocks.seq_len != L or blocks.n_heads != H:
        raise ValueError(f"block lists are for H={blocks.n_heads}, L={blocks.seq_len}; got H={H}, L={L}")
    group = H // H_kv
    mask = blocks.dense_mask().to(q.device)
    if not return_lse:
        # The same masked softmax through SDPA (all heads at once, no [H, L, L] fp32 scores held).
        allowed = expand_block_mask(mask, blocks.block_m, blocks.block_n, L)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.to(compute_dtype)[None], k.to(compute_dtype)[None], v.to(compute_dtype)[None], attn_mask=allowed[None],
            scale=scale, enable_gqa=group > 1)
        return out[0].to(q.dtype)
    out = torch.empty(H, L, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(H, L, dtype=torch.float32, device=q.device)
    for h in range(H):
        kh = k[h // group].to(compute_dtype)
        vh = v[h // group].to(compute_dtype)
        s = (q[h].to(compute_dtype) @ kh.T) * scale
        allowed = expand_block_mask(mask[h], blocks.block_m, blocks.block_n, L)
        s = s.masked_fill(~allowed, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - row_lse[:, None])
        out[h] = (p @ vh).to(q.dtype)
        lse[h] = row_lse.float()
    return (out, lse) if return_lse else out


class ReferenceBackend:
    """Dense scores with the §6 block mask; runs anywhere torch runs."""

    name = "reference"

    def __init__(self, compute_dtype: torch.dtype = torch.float32):
        self.compute_dtype = compute_dtype

    def forward(self, q, k, v, blocks, scale, return_lse=False):
        return block_sparse_attention(q, k, v, blocks, scale, return_lse, self.compute_dtype)
