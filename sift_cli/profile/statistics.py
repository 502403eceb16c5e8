"""The attention statistics of one document, in plain fp32 torch: the reference every faster path must equal
(SPEC §3).

Probabilities are computed one head group and one band of query rows at a time (`probability_bands`), normalised
over every key a query sees, prefix included: no n×n matrix for all heads is ever held, so memory stays near
`stats_budget_bytes` whatever the document length. `doc_attention_bits` turns them into LA tiles and CA pages.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.features import (PLAIN, LayerFeatures, cap_scores, masked_probabilities, visible,
                                  window_blocks)
from ..bits import n_pages
from ..config import ProfileConfig
from .mass_rule import band_mass_tiles, column_mass, mass_pages


def probability_bands(q: torch.Tensor, k: torch.Tensor, prefix_len: int, n_doc: int, scale: float, tile: int,
                      budget_bytes: int, feats: LayerFeatures = PLAIN):
    """Yield (h0, h1, r0, doc_probs, doc_causal) over bands of heads and of the document's query rows.

    doc_probs [h1 - h0, R, r1] fp32: softmax of rows r0 … r0 + R - 1 of the document (normalised over every key
    they see, prefix included), restricted to the document's keys 0 … r1 - 1; non-causal entries are exactly 0.
    doc_causal [R, r1]: which entries the query sees (causal, and inside the layer's window). The layer's
    soft-capping applies before the softmax and its sinks sit in the denominator (`attention.features`). Bands start at multiples of `tile`, and about four fp32 copies
    of a [heads, rows, S] band are alive at once, so memory stays near `budget_bytes` whatever the length.
    """
    H = q.shape[0]
    group = H // k.shape[0]
    S = prefix_len + n_doc
    dev = q.device
    per_head_row = 16 * S
    heads = max(1, min(H, budget_bytes // (per_head_row * tile)))
    rows = max(tile, (budget_bytes // (per_head_row * heads)) // tile * tile)
    key_pos = torch.arange(S, device=dev)
    for h0 in range(0, H, heads):
        h1 = min(H, h0 + heads)
        qh = q[h0:h1, prefix_len:S].float()
        kh = k[torch.arange(h0, h1, device=dev) // group, :S].float()
        for r0 in range(0, n_doc, rows):
            r1 = min(n_doc, r0 + rows)
            R, K = r1 - r0, prefix_len + r1
            scores = cap_scores(torch.matmul(qh[:, r0:r1], kh[:, :K].transpose(1, 2)).mul_(scale), feats.softcap)
            causal = visible(prefix_len + r0 + torch.arange(R, device=dev), key_pos[:K], feats.window)  # [R, K]
            probs = masked_probabilities(scores, causal, None if feats.sinks is None else feats.sinks[h0:h1])
            del scores
            yield h0, h1, r0, probs[:, :, prefix_len:], causal[:, prefix_len:]
            del probs


def band_tile_max(doc_probs: torch.Tensor, doc_causal: torch.Tensor, tile: int, mask: bool = True) -> torch.Tensor:
    """[h, R, C] band → [h, ceil(R/T), ceil(C/T)] maximum probability of each tile's causal cells (-1 if none).

    mask=False skips hiding the non-causal cells: they are exactly 0, which only a zero threshold can tell apart.
    Columns are reduced first, in place of the band (a view: padding the band to whole tiles would copy all of it,
    which took a seventh of a CPU profile), then rows on the T-times smaller result.
    """
    h, R, C = doc_probs.shape
    if mask:
        doc_probs = doc_probs.masked_fill(~doc_causal, -1.0)
    whole = C // tile * tile
    parts = [doc_probs[..., :whole].unflatten(-1, (whole // tile, tile)).amax(-1)] if whole else []
    if whole < C:
        parts.append(doc_probs[..., whole:].amax(-1, keepdim=True))
    col_max = torch.cat(parts, -1) if len(parts) > 1 else parts[0]  # [h, R, ceil(C/T)]
    rows_pad = -(-R // tile) * tile
    if rows_pad != R:
        col_max = F.pad(col_max, (0, 0, 0, rows_pad - R), value=-1.0)
    return col_max.view(h, rows_pad // tile, tile, col_max.shape[-1]).amax(2)


def doc_attention_bits(q: torch.Tensor, k: torch.Tensor, prefix_len: int, n_doc: int, scale: float,
                       cfg: ProfileConfig, feats: LayerFeatures = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
    """LA tiles bool [H, P, P] and CA pages bool [H, P] of one document.

    q [H, S, D], k [H_kv, S, D] are the layer's post-RoPE queries and keys of `prefix ‖ doc` (S may include right
    padding, which is ignored). Probabilities are normalised over every key a query sees, prefix included, with
    the layer's features (`feats`). A tile or page that the window makes unreachable is never set.
    """
    if cfg.rule == "mass":
        return doc_mass_bits(q, k, prefix_len, n_doc, scale, cfg, feats)
    H = q.shape[0]
    T = cfg.tile
    P = n_pages(n_doc, T)
    dev = q.device
    la = torch.zeros(H, P, P, dtype=torch.bool, device=dev)
    counts = torch.zeros(H, n_doc, dtype=torch.int32, device=dev)
    for h0, h1, r0, doc_probs, doc_causal in probability_bands(q, k, prefix_len, n_doc, scale, T,
                                                               cfg.stats_budget_bytes, feats):
        tile_max = band_tile_max(doc_probs, doc_causal, T, mask=cfg.alpha <= 0)
        la[h0:h1, r0 // T: r0 // T + tile_max.shape[1], : tile_max.shape[2]] = tile_max >= cfg.alpha
        high = doc_probs >= cfg.beta
        if cfg.beta <= 0:
            high &= doc_causal
        counts[h0:h1, : doc_probs.shape[2]] += high.sum(1, dtype=torch.int32)
        del doc_probs, high, tile_max  # before the next band is computed
    la &= torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    if feats.window is not None:  # tiles wholly outside the window: zero probability, but a zero alpha sets them
        starts = torch.arange(P, device=dev) * T
        lens = torch.clamp(n_doc - starts, max=T)
        la &= window_blocks(starts, lens, starts, lens, feats.window)
    la[:, torch.arange(P), torch.arange(P)] = True  # diagonal tiles are always computed

    seen_by = (n_doc - torch.arange(n_doc, device=dev)).float()  # queries i >= j that see key j
    if feats.window is not None:
        seen_by.clamp_(max=feats.window)
    hot = (counts.float() / seen_by) > cfg.gamma  # [H, n]
    hot = F.pad(hot, (0, P * T - n_doc), value=False)
    return la, hot.view(H, P, T).any(-1)


def doc_mass_bits(q: torch.Tensor, k: torch.Tensor, prefix_len: int, n_doc: int, scale: float,
                  cfg: ProfileConfig, feats: LayerFeatures = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
    """`doc_attention_bits` under the mass rule: each row drops ≤ ε of its mass, each head's CA pages ≤ ε' of
    the document's mean later-query mass (`mass_rule`)."""
    la, ca = doc_mass_bits_grid(q, k, prefix_len, n_doc, scale, cfg.tile, (cfg.epsilon,), (cfg.ca_epsilon,),
                                cfg.stats_budget_bytes, feats)
    return la[0], ca[0]


def doc_mass_bits_grid(q: torch.Tensor, k: torch.Tensor, prefix_len: int, n_doc: int, scale: float, tile: int,
                       epsilons: tuple[float, ...], ca_epsilons: tuple[float, ...], budget_bytes: int,
                       feats: LayerFeatures = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
    """The mass rule's LA tiles bool [nε, H, P, P] for every ε and CA pages bool [nε', H, P] for every ε', from
    one pass over the probabilities (the evaluations sweep ε and ε' without another model pass)."""
    H = q.shape[0]
    T = tile
    P = n_pages(n_doc, T)
    dev = q.device
    la = torch.zeros(len(epsilons), H, P, P, dtype=torch.bool, device=dev)
    col_sum = torch.zeros(H, n_doc, dtype=torch.float32, device=dev)
    for h0, h1, r0, doc_probs, _ in probability_bands(q, k, prefix_len, n_doc, scale, T, budget_bytes, feats):
        for e, tiles in enumerate(band_mass_tiles(doc_probs, r0, T, epsilons)):
            la[e, h0:h1, r0 // T: r0 // T + tiles.shape[1], : tiles.shape[2]] = tiles
        col_sum[h0:h1, : doc_probs.shape[2]] += column_mass(doc_probs)
        del doc_probs
    la &= torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    la[..., torch.arange(P), torch.arange(P)] = True
    return la, torch.stack([mass_pages(col_sum, n_doc, T, e) for e in ca_epsilons])
