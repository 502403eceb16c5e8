"""Threshold-free document statistics: the bits of SPEC §3 for any (T, α, β, γ) from one model pass.

Per (layer, head) of a document, one pass over `prefix ‖ doc` keeps

- `tile_max` [P, P] at a base tile size T0: the largest causal probability in each T0×T0 tile (-1 where a tile
  has no causal cell). The LA bit at threshold α is `tile_max >= α`; at a coarser T = k·T0 it is the max over the
  k×k sub-tiles (tiles are aligned to the document start at every size);
- `page_conc` [nβ, P] at T0: for each β of a fixed list, the largest key concentration c_j (share of the
  queries that see key j with A ≥ β) in each page. The CA bit at (β, γ) is `page_conc > γ`; at coarser T the max
  over the k pages.

So a sweep over α and γ (and T, and the listed β values) needs no further model pass. `derive_bits` turns the
statistics into exactly the bits `profile.profile_batch` would store (the tests compare them).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...attention.swap import swapped_attention
from ...bits import n_pages
from ...config import CPU_DEFAULTS
from ...profile.batches import padded_batch, plan_batches
from ...attention.features import PLAIN, call_features
from ...profile.forward import model_attention
from ...profile.statistics import band_tile_max, probability_bands

ATTN_NAME = "sift_eval_stats"
_state = threading.local()


@dataclass
class DocStats:
    n_tokens: int
    tile: int  # base tile T0
    betas: tuple[float, ...]
    tile_max: torch.Tensor  # fp32 [L, H, P, P]
    page_conc: torch.Tensor  # fp32 [nβ, L, H, P]


def doc_stats(q: torch.Tensor, k: torch.Tensor, prefix_len: int, n_doc: int, scale: float, tile: int,
              betas: tuple[float, ...], budget: int = CPU_DEFAULTS.stats_budget_bytes, feats=PLAIN
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """tile_max [H, P, P] and page_conc [nβ, H, P] of one document (q [H, S, D], k [H_kv, S, D], post-RoPE)."""
    H = q.shape[0]
    T, P = tile, n_pages(n_doc, tile)
    dev = q.device
    tmax = torch.full((H, P, P), -1.0, device=dev)
    counts = torch.zeros(len(betas), H, n_doc, dtype=torch.int32, device=dev)
    for h0, h1, r0, doc, causal in probability_bands(q, k, prefix_len, n_doc, scale, T, budget, feats):
        tm = band_tile_max(doc, causal, T)  # causal cells only: any α, zero included, can be applied later
        tmax[h0:h1, r0 // T: r0 // T + tm.shape[1], : tm.shape[2]] = tm
        for bi, beta in enumerate(betas):
            high = doc >= beta
            if beta <= 0:
                high &= causal
            counts[bi, h0:h1, : doc.shape[2]] += high.sum(1, dtype=torch.int32)
        del doc, tm
    visible = (n_doc - torch.arange(n_doc, device=dev)).float()
    if feats.window is not None:
        visible.clamp_(max=feats.window)
    conc = counts.float() / visible  # [nβ, H, n] — the same expression profile.py compares with γ
    conc = F.pad(conc, (0, P * T - n_doc), value=-1.0).view(len(betas), H, P, T).amax(-1)
    return tmax, conc


@dataclass
class _State:
    prefix_len: int
    lengths: list[int]
    tile: int
    betas: tuple[float, ...]
    budget: int
    tmax: list
    conc: list


def _stats_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    st: _State = _state.current
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    feats = call_features(kwargs)
    out = model_attention(query, key, value, scaling, feats)
    for b, n in enumerate(st.lengths):
        tm, pc = doc_stats(query[b], key[b], st.prefix_len, n, scaling, st.tile, st.betas, st.budget, feats)
        st.tmax[b][module.layer_idx] = tm.cpu()
        st.conc[b][module.layer_idx] = pc.cpu()
    return out.transpose(1, 2).contiguous(), None


@torch.inference_mode()
def collect_stats(model, prefix_ids: list[int], docs: list[list[int]], tile: int, betas: tuple[float, ...],
                  batch_tokens: int = CPU_DEFAULTS.batch_tokens, budget: int = CPU_DEFAULTS.stats_budget_bytes,
                  progress=None) -> list[DocStats]:
    device = next(model.parameters()).device
    L = model.config.num_hidden_layers
    out: list[DocStats | None] = [None] * len(docs)
    done = 0
    with swapped_attention(model, ATTN_NAME, _stats_attention):
        try:
            for batch in plan_batches([len(d) for d in docs], len(prefix_ids), batch_tokens):
                ids = padded_batch(prefix_ids, [docs[i] for i in batch])
                st = _State(len(prefix_ids), [len(docs[i]) for i in batch], tile, tuple(betas), budget,
                            [[None] * L for _ in batch], [[None] * L for _ in batch])
                _state.current = st
                getattr(model, "model", model)(input_ids=ids.to(device), use_cache=False)
                for row, i in enumerate(batch):
                    out[i] = DocStats(len(docs[i]), tile, tuple(betas), torch.stack(st.tmax[row]),
                                      torch.stack(st.conc[row], dim=1))
                done += sum(len(docs[i]) for i in batch)
                if progress:
                    progress(done, sum(map(len, docs)))
        finally:
            _state.current = None
    return out


def derive_bits(st: DocStats, tile: int, alpha: float, beta: float, gamma: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(LA bool [L, H, P, P], CA bool [L, H, P]) at (tile, α, β, γ); tile a multiple of the base tile, β one of
    the collected betas."""
    if tile % st.tile:
        raise ValueError(f"tile {tile} is not a multiple of the base tile {st.tile}")
    try:
        bi = st.betas.index(beta)
    except ValueError:
        raise ValueError(f"beta {beta} was not collected (have {st.betas})") from None
    f = tile // st.tile
    P0 = st.tile_max.shape[-1]
    P = n_pages(st.n_tokens, tile)
    tm, pc = st.tile_max, st.page_conc[bi]
    if f > 1:
        pad = P * f - P0
        tm = F.pad(tm, (0, pad, 0, pad), value=-1.0)
        tm = tm.view(*tm.shape[:2], P, f, P, f).amax(dim=(3, 5))
        pc = F.pad(pc, (0, pad), value=-1.0).view(*pc.shape[:2], P, f).amax(-1)
    tril = torch.ones(P, P, dtype=torch.bool).tril()
    la = (tm >= alpha) & tril
    la[..., torch.arange(P), torch.arange(P)] = True
    ca = pc > gamma
    return la, ca

