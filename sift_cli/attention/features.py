"""The attention extras some model families add to plain causal softmax attention, as transformers defines them
(the eager functions of the pinned version), in one place: every path that computes or measures attention (the
profiling statistics, the reference, gather and flex backends, the dense forwards) applies them through here.

- sliding window W: query i sees key j when i - W < j <= i (transformers' `sliding_window_overlay`);
- logit soft-capping c: scores → c · tanh(scores / c), after scaling and before the mask and the softmax;
- sinks s[h]: one extra logit per head in the softmax's denominator that attends to nothing (gpt-oss `s_aux`),
  so out = softmax-over-keys · sigmoid(lse − s[h]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BAND_ROWS = 512  # query rows per band of the dense featured forward


@dataclass(frozen=True, eq=False)
class LayerFeatures:
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [H] logits, one per query head

    @property
    def plain(self) -> bool:
        return self.window is None and self.softcap is None and self.sinks is None

    def names(self) -> list[str]:
        return [n for n, v in (("sliding window", self.window), ("soft-capping", self.softcap),
                               ("sinks", self.sinks)) if v is not None]


PLAIN = LayerFeatures()


def call_features(kwargs: dict) -> LayerFeatures:
    """The features a transformers attention call passes (`sliding_window`, `softcap`, `s_aux`)."""
    window, softcap, sinks = kwargs.get("sliding_window"), kwargs.get("softcap"), kwargs.get("s_aux")
    if not window and not softcap and sinks is None:
        return PLAIN
    return LayerFeatures(int(window) if window else None, float(softcap) if softcap else None, sinks)


def for_length(feats: LayerFeatures, length: int) -> LayerFeatures:
    """The features over a sequence of `length` tokens: a window of `length` or more hides no key (i − j < length
    for every pair), so it is dropped, and a layer left plain runs the plain path (the cuda kernel included)."""
    if feats.window is None or feats.window < length:
        return feats
    return PLAIN if feats.softcap is None and feats.sinks is None else LayerFeatures(None, feats.softcap, feats.sinks)


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """bool [R, K]: which keys (positions k_pos) each query (positions q_pos) sees: causal, within the window."""
    seen = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        seen &= k_pos[None, :] > q_pos[:, None] - window
    return seen


def cap_scores(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Soft-capping in place (scores already scaled)."""
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    return scores


def masked_probabilities(scores: torch.Tensor, allowed: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the allowed keys of fp32 scores [H, R, K] (capped), a head's sink logit in the denominator:
    probabilities of the keys only (rows sum to less than 1 with sinks). Masks `scores` in place."""
    scores = scores.masked_fill_(~allowed, float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    lse = torch.logaddexp(torch.logsumexp(scores, dim=-1), sinks.float().view(-1, 1).to(scores.device))
    return torch.exp(scores - lse[..., None])


def apply_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention over the keys only (out [H, L, D], natural-log lse [H, L]) → with each head's sink in the
    denominator."""
    if sinks is None:
        return out
    weight = torch.sigmoid(lse.float() - sinks.float().view(-1, 1).to(lse.device))
    return (out.float() * weight[..., None]).to(out.dtype)


def window_blocks(q_start, q_len, kv_start, kv_len, window: int | None) -> torch.Tensor | None:
    """bool [M, N]: query blocks × KV blocks holding at least one pair the window lets through (None: no window).
    A block pair's offsets j − i run over [ks − qe + 1, ke − 1 − qs]; the window keeps offsets in (−W, 0]."""
    if window is None:
        return None
    qs, qe = q_start.long()[:, None], (q_start + q_len).long()[:, None]
    ks, ke = kv_start.long()[None, :], (kv_start + kv_len).long()[None, :]
    return (ks - qe + 1 <= 0) & (ke - 1 - qs > -window)


def dense_featured(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                   feats: LayerFeatures, compute_dtype=torch.float32) -> torch.Tensor:
    """Dense attention with the layer's features: query [B, H, Lq, D] at the last Lq positions of key/value
    [B, H_kv, Lk, D] → [B, H, Lq, D] in query's dtype, a band of query rows at a time."""
    B, H, Lq, _ = query.shape
    Lk = key.shape[2]
    group = H // key.shape[1]
    kf, vf = key.to(compute_dtype), value.to(compute_dtype)
    if group > 1:
        kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    out = torch.empty(B, H, Lq, value.shape[-1], dtype=query.dtype, device=query.device)
    k_pos = torch.arange(Lk, device=query.device)
    for r0 in range(0, Lq, BAND_ROWS):
        r1 = min(Lq, r0 + BAND_ROWS)
        q_pos = torch.arange(Lk - Lq + r0, Lk - Lq + r1, device=query.device)
        scores = cap_scores(torch.matmul(query[:, :, r0:r1].to(compute_dtype), kf.transpose(2, 3)).mul_(scale),
                            feats.softcap)
        probs = masked_probabilities(scores, visible(q_pos, k_pos, feats.window), feats.sinks)
        out[:, :, r0:r1] = torch.matmul(probs, vf).to(query.dtype)
    return out


def window_lists(blocks, window: int):
    """A layer's BlockLists without the blocks its window hides entirely (every pair of the block at or before
    row − window); partial blocks stay, their hidden pairs masked by whoever computes them."""
    from ..block_lists import block_lists_from_mask

    t = blocks.table.to(blocks.offsets.device)
    keep = window_blocks(t.q_start, t.q_len, t.kv_start, t.kv_len, window)
    return block_lists_from_mask(blocks.dense_mask().to(keep.device) & keep[None], t)
