"""CPU sparse attention whose cost follows the listed blocks (the default sparse path on a CPU).

A (head, query block)'s listed KV blocks split three ways, by where they end: before the query block's segment
("cross": earlier documents' pages and the prefix), inside the segment before the block's first row ("own-far"),
and at or after it ("near": keys in [r0, r1), the causal triangle). Each part is one attention call that returns
its log-sum-exp, and the partial softmaxes are merged through them:

- near: SDPA's causal kernel over [r0, r1), every head at once; own-far: gathered keys without a mask, heads of one
  KV head with the same blocks in one call;
- a segment whose every query block lists all its own blocks (the common case: LA tiles are nearly dense) has its
  own part as one causal run over the segment instead, and the leading segments that list every causal block
  (the prefix, and the first document when its LA tiles are all set) one causal run over all their rows, which
  saves the first document's short call over the prefix; a causal run goes in 256-row chunks (`CAUSAL_CHUNK`);
- cross: consecutive query blocks of a segment listing the same cross blocks (CA pages are a property of the key
  document, so usually the whole segment) run as one unmasked call over all their rows. PyTorch's CPU flash op cuts
  short query runs into 32-row GEMMs and long ones into 256-row GEMMs, so long calls cost less per cell.

A layer whose lists hold every causal block is one plain causal SDPA call. Where the near keys are not exactly
[r0, r1) (query blocks on the global grid that straddle a segment), that head and block take the general path:
one SDPA call with an explicit mask over every listed key.

It computes the reference's function (SPEC §6). It needs PyTorch's CPU flash-attention op that returns the
log-sum-exp; without it every block takes the general path.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .base import BlockLists
from .head_pool import map_heads

_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# Rows per call of a long causal run. The CPU flash op computes query tiles of 256 rows (64 below 768 query rows)
# up to the diagonal, about half a tile of masked keys per row; 256-row chunks (each its causal square, plus the
# run's earlier keys unmasked) keep its 64-row tiles: measured 6 % less time for the demo's layers than one call
# per document, and 192 / 320 / 384 rows did worse.
CAUSAL_CHUNK = 256


def _attend_gqa(q, k, v, scale, causal):
    """q [H, R, D] over k/v [H_kv, K, D], heads h // (H / H_kv) sharing a KV head → (out [H, R, D], lse [H, R]).
    The KV heads are broadcast into the op's batch dimension, not copied (measured ~9 % faster than repeated K/V
    on a 950-row causal call)."""
    H, R = q.shape[:2]
    Hkv, K = k.shape[:2]
    out, lse = _FLASH(q.view(Hkv, H // Hkv, R, -1), k[:, None].expand(Hkv, H // Hkv, K, -1),
                      v[:, None].expand(Hkv, H // Hkv, K, -1), 0.0, causal, scale=scale)[:2]
    return out.reshape(H, R, -1), lse.reshape(H, R)


def _attend_shared(q, k, v, scale):
    """q [G, R, D] of G heads over one KV head's keys k/v [K, D], no mask → (out [G, R, D], lse [G, R]). The heads'
    rows go in as one sequence of G·R queries over the un-copied K/V (the CPU flash op cuts its work by query
    length; measured 1–5 % faster than G heads over an expanded K/V)."""
    G, R, D = q.shape
    out, lse = _FLASH(q.reshape(1, 1, G * R, D), k[None, None], v[None, None], 0.0, False, scale=scale)[:2]
    return out.view(G, R, -1), lse.view(G, R)


def _merge_into(o2, l2, o1, l1):
    """Two partial softmaxes over disjoint keys → the one over all of them, written over (o2, l2) in place and
    returned; l2 is finite (every row sees its own key in the near part)."""
    d = l1 - l2
    return o2.lerp_(o1, torch.sigmoid(d)[..., None]), l2.add_(F.softplus(d))


def _masked(q, kg, vg, keys, rows, scale):
    """One head, general path: q [R, D] over gathered keys with the causal mask keys <= rows."""
    allowed = keys[None, :] <= rows[:, None]
    s = (q @ kg.T).mul_(scale).masked_fill_(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[:, None]) @ vg, lse


def _run_starts(table) -> list[int]:
    """Each query block's run start: its segment's first row when query blocks are cut per segment (a block then
    lies in one segment), else the block's own first row. Listed blocks ending at or before it are "cross"."""
    q_start = table.q_start.tolist()
    if table.query_blocks != "segment" or table.n_kv_blocks == 0:
        return q_start
    starts, doc = table.kv_start.cpu().numpy(), table.kv_doc.cpu().numpy()
    first = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])  # each segment's first KV block
    seg_of = np.searchsorted(first, np.searchsorted(starts, q_start), side="right") - 1
    return starts[first[seg_of]].tolist()


@dataclass
class _Split:
    """Every (head, query block)'s list split by `_split`."""

    own_far: dict = field(default_factory=dict)  # (h, m) → own-far blocks, for pairs on the flash path
    cross: dict = field(default_factory=dict)  # (h, m) → cross blocks, for pairs on the flash path
    own_full: dict = field(default_factory=dict)  # (h, m) → True when it lists every own block of its segment
    all_causal: dict = field(default_factory=dict)  # (h, m) → True when it lists every causal block
    general: dict = field(default_factory=dict)  # m → [(h, every listed block)] on the masked path


def _split(offsets, indices, kv_start, kv_len, q_start, q_len, run_start, n_heads) -> _Split:
    out = _Split()
    for m, (r0, n_rows) in enumerate(zip(q_start, q_len)):
        r1, s0 = r0 + n_rows, run_start[m]
        near_end = bisect_left(kv_start, r1)  # kv_start ascends
        near_blocks = list(range(bisect_left(kv_start, r0), near_end))
        n_own = near_end - bisect_left(kv_start, s0)
        for h in range(n_heads):
            listed = indices[offsets[h][m]: offsets[h][m + 1]]
            ends = [(kv_start[kb] + kv_len[kb], kb) for kb in listed]
            cross = tuple(sorted(kb for e, kb in ends if e <= s0))
            far = tuple(sorted(kb for e, kb in ends if s0 < e <= r0))
            near = sorted(kb for e, kb in ends if e > r0)
            if _FLASH is not None and near == near_blocks and all(kv_start[kb] >= r0 for kb in near):
                out.own_far[h, m], out.cross[h, m] = far, cross
                out.own_full[h, m] = len(far) + len(near) == n_own
                out.all_causal[h, m] = len(listed) == near_end  # the causal blocks are those before near_end
            else:
                out.general.setdefault(m, []).append((h, cross + far + tuple(near)))
    return out


def _segments(run_start: list[int]) -> list[tuple[int, int]]:
    """Query block ranges [m, e) sharing a run start."""
    bounds = [m for m in range(len(run_start)) if m == 0 or run_start[m] != run_start[m - 1]]
    return list(zip(bounds, bounds[1:] + [len(run_start)]))


def _leading_dense(split: _Split, segments, n_heads: int) -> dict[int, list[int]]:
    """Heads whose first segments (two or more) list every causal block, by how many: n → heads."""
    lead: dict[int, list[int]] = {}
    for h in range(n_heads):
        n = 0
        while n < len(segments) and all(split.all_causal.get((h, m), False) for m in range(*segments[n])):
            n += 1
        if n > 1:
            lead.setdefault(n, []).append(h)
    return lead


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
            o, lse_ = _attend_gqa(qc, kc, vc, scale, True)
            lse.copy_(lse_)
        else:
            o = F.scaled_dot_product_attention(qc[None], kc[None], vc[None], is_causal=True, scale=scale,
                                               enable_gqa=group > 1)[0]
        out.copy_(o)
        return (out, lse) if return_lse else out

    kv_start, kv_len = table.kv_start.tolist(), table.kv_len.tolist()
    q_start, q_len = table.q_start.tolist(), table.q_len.tolist()
    run_start = _run_starts(table)
    segments = _segments(run_start)
    split = _split(blocks.offsets.tolist(), blocks.indices[: blocks.computed_blocks()].tolist(), kv_start, kv_len,
                   q_start, q_len, run_start, H)
    starts, lens = table.kv_start.cpu().numpy().astype(np.int64), table.kv_len.cpu().numpy().astype(np.int64)
    # merged so far, per row: straight in the outputs when they have the compute dtype (fp32 on a CPU)
    o_all = out if out.dtype == compute_dtype else torch.empty_like(out, dtype=compute_dtype)
    l_all = lse if lse.dtype == compute_dtype else torch.empty_like(lse, dtype=compute_dtype)

    def keys_of(kbs) -> torch.Tensor:  # the keys of blocks kbs, in order
        b = np.asarray(kbs, dtype=np.int64)
        n = lens[b]
        ends = np.cumsum(n)
        return torch.from_numpy(np.arange(ends[-1]) + np.repeat(starts[b] - (ends - n), n)).to(q.device)

    def pick(hs):  # a view for consecutive heads (one KV head's, or all), an index otherwise
        return slice(hs[0], hs[-1] + 1) if hs[-1] - hs[0] == len(hs) - 1 else hs

    def span(hs, r0, r1, k0, k1, is_causal):  # heads hs (ascending), rows [r0, r1) over keys [k0, k1)
        # K/V stay views of their KV heads (indexing them copies keys [k0, k1) per query head): one call when
        # every KV head involved has as many of the heads (all heads, say), else one per KV head
        per_kv: dict[int, list[int]] = {}
        for h in hs:
            per_kv.setdefault(h // group, []).append(h)
        runs = list(per_kv.values())
        if all(len(r) == len(runs[0]) for r in runs):
            kv = pick(list(per_kv))
            return _attend_gqa(qc[pick(hs), r0:r1], kc[kv, k0:k1], vc[kv, k0:k1], scale, is_causal)
        parts = [_attend_gqa(qc[pick(r), r0:r1], kc[g: g + 1, k0:k1], vc[g: g + 1, k0:k1], scale, is_causal)
                 for g, r in per_kv.items()]
        return torch.cat([o for o, _ in parts]), torch.cat([lo for _, lo in parts])

    def causal(hs, r0, r1):  # heads hs, rows [r0, r1) over keys [r0, r1), causal
        return span(hs, r0, r1, r0, r1, True)

    def long_causal(hs, r0, r1):  # causal() straight into the outputs, in chunks of CAUSAL_CHUNK rows
        for a in range(r0, r1, CAUSAL_CHUNK):
            b = min(r1, a + CAUSAL_CHUNK)
            o, lo = causal(hs, a, b)
            if a > r0:
                _merge_into(o, lo, *span(hs, a, b, r0, a, False))
            o_all[pick(hs), a:b], l_all[pick(hs), a:b] = o, lo

    def shared(hs, g, r0, r1, kbs):  # heads hs of KV head g, rows [r0, r1) over blocks kbs, no mask
        keys = keys_of(kbs)
        return _attend_shared(qc[pick(hs), r0:r1], kc[g].index_select(0, keys), vc[g].index_select(0, keys), scale)

    # The leading segments whose query blocks list every causal block (the prefix, then documents while their LA
    # tiles are all set): one causal run over their rows, with no cross part.
    whole = set()
    for n_seg, hs in _leading_dense(split, segments, H).items():
        e = segments[n_seg - 1][1]
        long_causal(hs, 0, q_start[e - 1] + q_len[e - 1])
        for h in hs:
            for m in range(e):
                whole.add((h, m))
                split.cross[h, m] = ()
    # Own part of a segment whose every query block lists all its own blocks: one causal run over the segment.
    for m, e in segments:
        if e - m == 1 and run_start[m] == q_start[m]:
            continue  # one block: the per-block path below does the same
        hs = [h for h in range(H)
              if (h, m) not in whole and all(split.own_full.get((h, j), False) for j in range(m, e))]
        if hs:
            long_causal(hs, q_start[m], q_start[e - 1] + q_len[e - 1])
            whole.update((h, j) for h in hs for j in range(m, e))
    # Own part of every other query block: near (causal) + own-far (gathered), or the general masked path.
    for m, (r0, n_rows) in enumerate(zip(q_start, q_len)):
        r1 = r0 + n_rows
        far_of: dict[tuple, list[int]] = {}  # (own-far blocks, KV head) → query heads
        for h in range(H):
            if (h, m) in split.own_far and (h, m) not in whole:
                far_of.setdefault((split.own_far[h, m], h // group), []).append(h)
        if far_of:
            heads = sorted(h for hs in far_of.values() for h in hs)
            o_near, l_near = causal(heads, r0, r1)
            slot = {h: i for i, h in enumerate(heads)}
        for (far, g), hs in far_of.items():
            idx = pick([slot[h] for h in hs])
            o, lo = o_near[idx], l_near[idx]
            if far:  # each head's rows of o_near are merged once: in place
                _merge_into(o, lo, *shared(hs, g, r0, r1, far))
            o_all[pick(hs), r0:r1], l_all[pick(hs), r0:r1] = o, lo
        for h, listed in split.general.get(m, ()):
            keys = keys_of(listed)
            o_all[h, r0:r1], l_all[h, r0:r1] = _masked(qc[h, r0:r1], kc[h // group].index_select(0, keys),
                                                       vc[h // group].index_select(0, keys), keys,
                                                       torch.arange(r0, r1, device=q.device), scale)
    # Cross part: consecutive query blocks of a segment with the same cross blocks as one call over their rows.
    runs: dict[tuple, list[int]] = {}  # (first row, end row, cross blocks, KV head) → query heads
    for m0, e0 in segments:
        for h in range(H):
            m = m0
            while m < e0:
                cross = split.cross.get((h, m))
                e = m + 1
                while cross is not None and e < e0 and split.cross.get((h, e)) == cross:
                    e += 1
                if cross:
                    runs.setdefault((q_start[m], q_start[e - 1] + q_len[e - 1], cross, h // group), []).append(h)
                m = e
    for (r0, r1, cross, g), hs in runs.items():
        at = pick(hs)
        if isinstance(at, slice):  # views of the outputs: merged in place
            _merge_into(o_all[at, r0:r1], l_all[at, r0:r1], *shared(hs, g, r0, r1, cross))
        else:
            o_all[at, r0:r1], l_all[at, r0:r1] = _merge_into(o_all[at, r0:r1], l_all[at, r0:r1],
                                                             *shared(hs, g, r0, r1, cross))
    if o_all is not out:
        out.copy_(o_all)
    if l_all is not lse:
        lse.copy_(l_all)
    return (out, lse) if return_lse else out


def _head_lists(blocks: BlockLists, h: int) -> BlockLists:
    """Head h's lists alone (offsets rebased to 0)."""
    off = blocks.offsets[h: h + 1]
    base, end = int(off[0, 0]), int(off[0, -1])
    return BlockLists(off - base, blocks.indices[base:end], blocks.table,
                      None if blocks.mask is None else blocks.mask[h: h + 1])


def headwise_attention(q, k, v, blocks: BlockLists, scale: float, return_lse: bool = False,
                       compute_dtype: torch.dtype = torch.float32):
    """`gathered_attention` one head at a time, the heads spread over a thread pool (`head_pool.map_heads`):
    the same function, each head's calls single-threaded."""
    H, L = q.shape[:2]
    group = H // k.shape[0]
    if H == 1 or q.device.type != "cpu" or torch.get_num_threads() <= 1:
        return gathered_attention(q, k, v, blocks, scale, return_lse, compute_dtype)
    blocks = blocks.to(q.device)
    out = torch.empty(H, L, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(H, L, dtype=torch.float32, device=q.device) if return_lse else None

    def one(h):
        g = h // group
        r = gathered_attention(q[h: h + 1], k[g: g + 1], v[g: g + 1], _head_lists(blocks, h), scale, return_lse,
                               compute_dtype)
        if return_lse:
            out[h: h + 1], lse[h: h + 1] = r
        else:
            out[h: h + 1] = r

    map_heads(one, H)
    return (out, lse) if return_lse else out


class GatherBackend:
    """Attention over the gathered keys of the listed blocks, per segment where the lists allow it, else per query
    block (`gathered_attention`): cost follows the listed blocks. The heads run on a pool of threads
    (`headwise_attention`)."""

    name = "gather"
    QUERY_ROWS = 512

    def __init__(self, compute_dtype: torch.dtype = torch.float32):
        self.compute_dtype = compute_dtype

    def query_block_rows(self, head_dim: int, seq_len: int, dense_share: float = 0.0) -> int:
        """512 rows (measured on the demo's prompts, docs/benchmarks.md): the CPU flash op costs less per cell on
        long query runs, and every query block adds python and indexing work, so 512-row blocks ran the demo's
        layers as fast as SDPA's causal kernel over every cell, where 128-row blocks were 10 % slower; the union
        of their tile rows computes about 1 % more cells (a document's LA tiles are nearly all set)."""
        return self.QUERY_ROWS

    def forward(self, q, k, v, blocks, scale, return_lse=False):
        return headwise_attention(q, k, v, blocks, scale, return_lse, self.compute_dtype)
