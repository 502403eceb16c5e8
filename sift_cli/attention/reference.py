"""Ground-truth block-sparse attention in plain PyTorch: dense scores, the block mask of SPEC §6, softmax.

A listed block (qb, kb) allows every causal pair (i, j) with row i in query block qb and key j in KV block kb of
the prompt's block table (blocks follow the segments, so a key outside a partial block's range is never in it).

Every other backend is checked against this one. Without LSE it runs the masked softmax through SDPA with a
boolean [H, L, L] mask in fp32; with LSE it materialises each head's [L, L] scores explicitly. Either way it is
for tests, CPU runs and modest lengths, not for speed.

The banded mode (`ReferenceBackend(rows=...)`, `banded_block_sparse_attention`) computes the same function a band
of query rows at a time: the [H, L, L] token mask is never built, each band gathers its rows' block mask and stops
at its last key. On CPU it is several times faster than the full path at 3K–6K tokens and needs a fraction of its
memory, which is what makes the CPU evaluations (QA over many questions, sweeps) affordable.

A layer with attention features (`features.LayerFeatures`: window, soft-capping, sinks) runs the banded mode with
them: the window joins the token mask, soft-capping applies to the scores, the sinks join the denominator.
"""

from __future__ import annotations

import torch

from ..block_table import BlockTable
from .base import BlockLists
from .features import PLAIN, LayerFeatures, cap_scores, masked_probabilities

BAND_ROWS = 512  # query rows per band in the banded mode


def expand_block_mask(blocks: torch.Tensor, table: BlockTable, rows: slice | None = None,
                      keys: int | None = None, window: int | None = None) -> torch.Tensor:
    """Boolean [..., M, N] block mask → [..., R, K] token mask for query rows `rows` (default all) and the first
    `keys` keys (default all), intersected with causality (and a sliding window)."""
    row_block, key_block = table.to(blocks.device).token_blocks()
    rows = rows or slice(0, table.seq_len)
    keys = table.seq_len if keys is None else keys
    mask = blocks[..., row_block[rows], :][..., key_block[:keys]]
    pos = torch.arange(table.seq_len, device=blocks.device)
    seen = pos[None, :keys] <= pos[rows, None]
    if window is not None:
        seen &= pos[None, :keys] > pos[rows, None] - window
    return mask & seen


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: BlockLists,
    scale: float,
    return_lse: bool = False,
    compute_dtype: torch.dtype = torch.float32,
    features: LayerFeatures = PLAIN,
):
    """q [H, L, D], k/v [H_kv, L, D] → out [H, L, D] (q's dtype), optionally lse [H, L] (fp32, natural log)."""
    if not features.plain:
        if return_lse:
            raise ValueError("the log-sum-exp of a layer with attention features is not computed")
        return banded_block_sparse_attention(q, k, v, blocks, scale, BAND_ROWS, compute_dtype, features)
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
        allowed = expand_block_mask(mask, blocks.table)
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
        allowed = expand_block_mask(mask[h], blocks.table)
        s = s.masked_fill(~allowed, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - row_lse[:, None])
        out[h] = (p @ vh).to(q.dtype)
        lse[h] = row_lse.float()
    return (out, lse) if return_lse else out


def banded_block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists,
                                  scale: float, rows: int = BAND_ROWS, compute_dtype=torch.float32,
                                  features: LayerFeatures = PLAIN) -> torch.Tensor:
    """`block_sparse_attention` (without LSE) a band of `rows` query rows at a time: q [H, L, D], k/v [H_kv, L, D]
    → out [H, L, D] in q's dtype, with the layer's attention features."""
    H, L, _ = q.shape
    group = H // k.shape[0]
    mask = blocks.dense_mask().to(q.device)  # [H, M, N]
    kf = k.to(compute_dtype)
    vf = v.to(compute_dtype)
    if group > 1:
        kf, vf = kf.repeat_interleave(group, 0), vf.repeat_interleave(group, 0)
    out = torch.empty(q.shape[:2] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    for r0 in range(0, L, rows):
        r1 = min(L, r0 + rows)
        s = torch.matmul(q[:, r0:r1].to(compute_dtype), kf[:, :r1].transpose(1, 2)).mul_(scale)  # [H, R, r1]
        allowed = expand_block_mask(mask, blocks.table, slice(r0, r1), r1, features.window)
        probs = masked_probabilities(cap_scores(s, features.softcap), allowed, features.sinks)
        out[:, r0:r1] = torch.matmul(probs.to(compute_dtype), vf[:, :r1]).to(q.dtype)
    return out


class ReferenceBackend:
    """Dense scores with the §6 block mask; runs anywhere torch runs. rows: the banded mode, `rows` query rows at a
    time (the log-sum-exp, when asked for, still comes from the full path)."""

    name = "reference"

    def __init__(self, compute_dtype: torch.dtype = torch.float32, rows: int | None = None):
        self.compute_dtype = compute_dtype
        self.rows = rows

    def forward(self, q, k, v, blocks, scale, return_lse=False, features: LayerFeatures = PLAIN):
        if self.rows is not None and not return_lse:
            return banded_block_sparse_attention(q, k, v, blocks, scale, self.rows, self.compute_dtype, features)
        return block_sparse_attention(q, k, v, blocks, scale, return_lse, self.compute_dtype, features)
