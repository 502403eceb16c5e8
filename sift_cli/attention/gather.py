"""CPU sparse attention whose cost follows the listed blocks (the default sparse path on a CPU).

For each query block (rows [r0, r1)) and head, the listed KV blocks split in two: the far ones (every key < r0,
so every row of the block sees all of them: no mask) and the near ones (keys in [r0, r1), the causal triangle).
The far keys are gathered and attended without a mask, the near ones with SDPA's own causal kernel, and the two
partial softmaxes are merged through their log-sum-exps. Heads of one KV head whose far blocks are the same share
one call (and one gather of its keys), and a layer whose lists hold every causal block is one plain causal SDPA
call. Where the near keys are not exactly [r0, r1) (query blocks on the global grid that straddle a segment), that
head and block take the general path: one SDPA call with an explicit mask.

It computes the reference's function (SPEC §6). It needs PyTorch's CPU flash-attention op that returns the
log-sum-exp; without it every block takes the general path.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import torch
import torch.nn.functional as F

from .base import BlockLists

_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend(q, k, v, scale, causal):
    """q [G, R, D], k/v [G, K, D] → (out [G, R, D], lse [G, R]) through the CPU flash op."""
    out, lse = _FLASH(q[None], k[None], v[None], 0.0, causal, scale=scale)[:2]
    return out[0], lse[0]


def _attend_shared(q, k, v, scale):
    """q [G, R, D] of G heads over one KV head's keys k/v [K, D], no mask → (out [G, R, D], lse [G, R]). The heads'
    rows go in as one sequence of G·R queries over the un-copied K/V (the CPU flash op cuts its work by query
    length; measured 1–5 % faster than G heads over an expanded K/V)."""
    G, R, D = q.shape
    out, lse = _FLASH(q.reshape(1, 1, G * R, D), k[None, None], v[None, None], 0.0, False, scale=scale)[:2]
    return out.view(G, R, -1), lse.view(G, R)


def _merge(o1, l1, o2, l2):
    """Two partial softmaxes over disjoint keys → the one over all of them; l2 is finite (every row sees its own
    key in the near part)."""
    d = l1 - l2
    return torch.lerp(o2, o1, torch.sigmoid(d)[..., None]), l2 + F.softplus(d)


def _masked(q, kg, vg, keys, rows, scale, return_lse):
    """One head, general path: q [R, D] over gathered keys with the causal mask keys <= rows."""
    allowed = keys[None, :] <= rows[:, None]
    s = (q @ kg.T).mul_(scale).masked_fill_(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[:, None]) @ vg, lse


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists, scale: float,
                       return_lse: bool = False, compute_dtype: torch.dtype = torch.float32):
    """q [H, L, D], k/v [H_kv, L, D] → out [H, L, D] in q's dtype (+ lse [H, L] fp32, natural log)."""
    H, L, D = q.shape
    group = H // k.shape[0]
    blocks = blocks.to(q.device)
    table = blocks.table
    qc, kc, vc = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
    out = torch.empty(H, L, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(H, L, dtype=torch.float32, device=q.device)
    if blocks.computed_blocks() == blocks.causal_blocks() and _FLASH is not None:  # every causal block: dense
        if return_lse:
            o, lse_ = _attend(qc, kc.repeat_interleave(group, 0), vc.repeat_interleave(group, 0), scale, True)
            lse.copy_(lse_)
        else:
            o = F.scaled_dot_product_attention(qc[None], kc[None], vc[None], is_causal=True, scale=scale,
                                               enable_gqa=group > 1)[0]
        out.copy_(o)
        return (out, lse) if return_lse else out

    offsets = blocks.offsets.tolist()
    indices = blocks.indices[: blocks.computed_blocks()].tolist()
    kv_start, kv_len = table.kv_start.tolist(), table.kv_len.tolist()
    pos = torch.arange(L, device=q.device)
    starts, lens = table.kv_start.cpu().numpy().astype(np.int64), table.kv_len.cpu().numpy().astype(np.int64)

    def keys_of(kbs) -> torch.Tensor:  # the keys of blocks kbs, in order
        b = np.asarray(kbs, dtype=np.int64)
        n = lens[b]
        ends = np.cumsum(n)
        return torch.from_numpy(np.arange(ends[-1]) + np.repeat(starts[b] - (ends - n), n)).to(q.device)

    def pick(hs):  # a view for one head, an index otherwise
        return slice(hs[0], hs[0] + 1) if len(hs) == 1 else hs

    for m, (r0, n_rows) in enumerate(zip(table.q_start.tolist(), table.q_len.tolist())):
        r1 = r0 + n_rows
        near_blocks = list(range(bisect_left(kv_start, r0), bisect_left(kv_start, r1)))  # kv_start ascends
        far_of: dict[tuple, list[int]] = {}  # (far block list, KV head) → query heads
        general = []
        for h in range(H):
            listed = indices[offsets[h][m]: offsets[h][m + 1]]
            far = tuple(sorted(kb for kb in listed if kv_start[kb] + kv_len[kb] <= r0))
            near = sorted(kb for kb in listed if kv_start[kb] + kv_len[kb] > r0)
            if _FLASH is not None and near == near_blocks and all(kv_start[kb] >= r0 for kb in near):
                far_of.setdefault((far, h // group), []).append(h)
            else:
                general.append((h, far + tuple(near)))
        if far_of:  # near part: the causal triangle of [r0, r1), every head at once
            heads = sorted(h for hs in far_of.values() for h in hs)
            if len(heads) == H:
                kn, vn = (t[:, r0:r1].repeat_interleave(group, 0) for t in (kc, vc))
                o_near, l_near = _attend(qc[:, r0:r1], kn, vn, scale, True)
            else:
                kv = torch.tensor(heads, device=q.device) // group
                o_near, l_near = _attend(qc[heads, r0:r1], kc[kv, r0:r1], vc[kv, r0:r1], scale, True)
            slot = {h: i for i, h in enumerate(heads)}
        for (far, g), hs in far_of.items():
            idx = pick([slot[h] for h in hs])
            o, lo = o_near[idx], l_near[idx]
            if far:
                keys = keys_of(far)
                o_far, l_far = _attend_shared(qc[pick(hs), r0:r1], kc[g].index_select(0, keys),
                                              vc[g].index_select(0, keys), scale)
                o, lo = _merge(o_far, l_far, o, lo)
            out[pick(hs), r0:r1] = o.to(q.dtype)
            if return_lse:
                lse[pick(hs), r0:r1] = lo.float()
        for h, listed in general:
            keys = keys_of(listed)
            o, lo = _masked(qc[h, r0:r1], kc[h // group].index_select(0, keys), vc[h // group].index_select(0, keys),
                            keys, pos[r0:r1], scale, return_lse)
            out[h, r0:r1] = o.to(q.dtype)
            lse[h, r0:r1] = lo.float()
    return (out, lse) if return_lse else out


class GatherBackend:
    """Per query block, attention over the gathered keys of its listed blocks: cost follows the listed blocks."""

    name = "gather"

    def __init__(self, compute_dtype: torch.dtype = torch.float32):
        self.compute_dtype = compute_dtype

    def forward(self, q, k, v, blocks, scale, return_lse=False):
        return gathered_attention(q, k, v, blocks, scale, return_lse, self.compute_dtype)
