"""The mass rule's bits of a prompt set's documents for a grid of ε and ε' from one model pass (as
`thresholds.collect_stats` does for the paper rule's thresholds): `MassSweepContext` evaluates them exactly as
`SweepContext` evaluates grid points, on the same dense references."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ...attention.features import call_features, for_length
from ...attention.swap import swapped_attention
from ...bits import pack_doc
from ...config import CPU_DEFAULTS, device_defaults
from ...errors import SiftError
from ...profile.batches import padded_batch, plan_batches
from ...profile.forward import model_attention
from ...profile.statistics import doc_mass_bits_grid
from .sweep import SweepContext

ATTN_NAME = "sift_eval_mass"
_state = threading.local()


@dataclass(frozen=True)
class MassPoint:
    tile: int
    epsilon: float
    ca_epsilon: float

    def label(self) -> str:
        return f"T={self.tile} ε={self.epsilon:g} ε'={self.ca_epsilon:g}"

    def as_dict(self) -> dict:
        return {"tile_size": self.tile, "rule": "mass", "epsilon": self.epsilon, "ca_epsilon": self.ca_epsilon}


def parse_mass_points(text: str, tile: int) -> list[MassPoint]:
    """'ε,ε';ε,ε';…' → mass-rule points at tile `tile`."""
    out = []
    for part in text.replace(" ", "").split(";"):
        if not part:
            continue
        try:
            e, ce = part.split(",")
            out.append(MassPoint(int(tile), float(e), float(ce)))
        except ValueError:
            raise SiftError(f"--mass-points: {part!r} is not 'epsilon,ca_epsilon'") from None
    for p in out:
        if not (0 <= p.epsilon < 1 and 0 <= p.ca_epsilon < 1):
            raise SiftError(f"--mass-points: {p.label()}: ε and ε' must be at least 0 and below 1")
    if not out:
        raise SiftError("--mass-points: no points")
    return out


def _mass_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    st = _state.current
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    feats = for_length(call_features(kwargs), key.shape[2])  # the layer's window, soft-cap and sinks
    for b, n in enumerate(st["lengths"]):
        la, ca = doc_mass_bits_grid(query[b], key[b], st["prefix_len"], n, scaling, st["tile"], st["epsilons"],
                                    st["ca_epsilons"], st["budget"], feats)
        st["la"][b][module.layer_idx], st["ca"][b][module.layer_idx] = la.cpu(), ca.cpu()
    return model_attention(query, key, value, scaling, feats).transpose(1, 2).contiguous(), None


@torch.inference_mode()
def collect_mass_bits(model, prefix_ids: list[int], docs: list[list[int]], tile: int, epsilons: tuple[float, ...],
                      ca_epsilons: tuple[float, ...], batch_tokens: int = CPU_DEFAULTS.batch_tokens,
                      budget: int = CPU_DEFAULTS.stats_budget_bytes) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per document (LA bool [nε, L, H, P, P], CA bool [nε', L, H, P]): what `sift profile --rule mass` stores at
    each ε and ε'."""
    device = next(model.parameters()).device
    L = model.config.num_hidden_layers
    out: list = [None] * len(docs)
    with swapped_attention(model, ATTN_NAME, _mass_attention):
        try:
            for batch in plan_batches([len(d) for d in docs], len(prefix_ids), batch_tokens):
                ids = padded_batch(prefix_ids, [docs[i] for i in batch])
                st = {"prefix_len": len(prefix_ids), "lengths": [len(docs[i]) for i in batch], "tile": tile,
                      "epsilons": tuple(epsilons), "ca_epsilons": tuple(ca_epsilons), "budget": budget,
                      "la": [[None] * L for _ in batch], "ca": [[None] * L for _ in batch]}
                _state.current = st
                getattr(model, "model", model)(input_ids=ids.to(device), use_cache=False)
                for row, i in enumerate(batch):
                    out[i] = (torch.stack(st["la"][row], dim=1), torch.stack(st["ca"][row], dim=1))
        finally:
            _state.current = None
    return out


class MassSweepContext(SweepContext):
    """A `SweepContext` whose points are `MassPoint`s: the same prompts, dense references and evaluation, the
    bits from `collect_mass_bits` (one model pass for every point of one tile)."""

    def __init__(self, base: SweepContext, points: list[MassPoint]):
        tiles = {p.tile for p in points}
        if len(tiles) != 1:
            raise SiftError("mass-rule points of one sweep share one tile")
        self.lm, self.pset, self.max_new_tokens = base.lm, base.pset, base.max_new_tokens
        self.prefix, self.dense, self._bits_cache = base.prefix, base.dense, {}
        self.epsilons = tuple(sorted({p.epsilon for p in points}))
        self.ca_epsilons = tuple(sorted({p.ca_epsilon for p in points}))
        ids = sorted(base.docs)
        defaults = device_defaults(self.lm.device)
        bits = collect_mass_bits(self.lm.model, self.prefix, [base.docs[d][0] for d in ids], tiles.pop(),
                                 self.epsilons, self.ca_epsilons, defaults.batch_tokens, defaults.stats_budget_bytes)
        self.docs = {d: (base.docs[d][0], b) for d, b in zip(ids, bits)}

    def bits(self, point: MassPoint, doc_id: str):
        key = (point, doc_id)
        if key not in self._bits_cache:
            la_all, ca_all = self.docs[doc_id][1]
            la = la_all[self.epsilons.index(point.epsilon)]
            ca = ca_all[self.ca_epsilons.index(point.ca_epsilon)]
            P = la.shape[-1]
            self._bits_cache[key] = (pack_doc(la, ca), float(la.sum()) / (la.shape[0] * la.shape[1] * P * (P + 1) / 2),
                                     float(ca.float().mean()))
        return self._bits_cache[key]
