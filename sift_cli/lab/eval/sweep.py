"""Density and fidelity over a grid of thresholds (paper Fig. 16; STUDY.md's sparse-prefill table).

The documents of a prompt set are run once to collect threshold-free statistics (`thresholds`); every grid point
(T, α, β, γ) then gets its bits without another profiling pass. For each point and prompt: the cell density the
block mask computes (computed (query, key) cells / causal cells, all layers and heads — STUDY.md's density), the
block density, KL(full ‖ SIFT) at the last position, whether the first token is the same, whether the greedy
answer (`max_new_tokens`) is the same, and optionally the recall of `recall`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np
import torch

from ...bits import pack_doc
from ...block_lists import decode_layer, mean_densities
from ...block_table import BlockTable
from ...config import device_defaults
from ...corpus import CorpusFormat, load_documents
from ...errors import SiftError
from ...prefill.assemble import build_prompt
from ...prefill.generate import greedy_generate
from ...prefill.options import PrefillOptions
from ...prefill.report import compare_logits
from ...prefill.run import dense_prefill, sparse_prefill
from ...tokens import prefix_token_ids, tokenize_documents
from ..runs import ModelSpec, ProgressBar, no_progress, run_metadata
from .backend import model_backend
from .probe import probe_forward
from .prompt_sets import PromptSet, builtin_prompt_set, check_document_count, corpus_prompt_set
from .recall import COUNTS, RecallProbe, summarize
from .thresholds import collect_stats, derive_bits


@dataclass(frozen=True)
class GridPoint:
    tile: int
    alpha: float
    beta: float
    gamma: float

    def label(self) -> str:
        return f"T={self.tile} α={self.alpha:g} β={self.beta:g} γ={self.gamma:g}"

    def as_dict(self) -> dict:
        return {"tile_size": self.tile, "alpha": self.alpha, "beta": self.beta, "gamma": self.gamma}


def grid(tiles, alphas, betas, gammas) -> list[GridPoint]:
    return [GridPoint(int(t), float(a), float(b), float(g)) for t, a, b, g in itertools.product(tiles, alphas, betas,
                                                                                              gammas)]


def parse_points(text: str) -> list[GridPoint]:
    """'T,α,β,γ;T,α,β,γ;…' → explicit grid points."""
    out = []
    for part in text.replace(" ", "").split(";"):
        if not part:
            continue
        try:
            t, a, b, g = part.split(",")
            out.append(GridPoint(int(t), float(a), float(b), float(g)))
        except ValueError:
            raise SiftError(f"--points: {part!r} is not 'T,alpha,beta,gamma'") from None
    if not out:
        raise SiftError("--points: no grid points")
    return out


def check_points(points: list[GridPoint]) -> int:
    """Validate; return the base tile (gcd of the tile sizes) the statistics are collected at."""
    for p in points:
        if p.tile not in (16, 32, 64, 128, 256):
            raise SiftError(f"tile {p.tile}: must be a power of two from 16 to 256")
        for name in ("alpha", "beta", "gamma"):
            if not 0.0 <= getattr(p, name) <= 1.0:
                raise SiftError(f"{name} {getattr(p, name)}: must be between 0 and 1")
    return math.gcd(*[p.tile for p in points])


class SweepContext:
    """Everything computed once per prompt set: token ids, statistics, dense references."""

    def __init__(self, lm, pset: PromptSet, points: list[GridPoint], max_new_tokens: int = 16, progress=None):
        self.lm, self.pset, self.max_new_tokens = lm, pset, max_new_tokens
        base = check_points(points)
        self.prefix = prefix_token_ids(lm.tokenizer)
        docs = pset.used_docs()
        tokens = tokenize_documents(lm.tokenizer, docs)
        too_long = [d.doc_id for d, t in zip(docs, tokens) if len(self.prefix) + len(t) > lm.max_context]
        if too_long:
            raise SiftError(f"document {too_long[0]!r} is longer than the model's context")
        betas = tuple(sorted({p.beta for p in points}))
        defaults = device_defaults(lm.device)
        stats = collect_stats(lm.model, self.prefix, tokens, base, betas, batch_tokens=defaults.batch_tokens,
                              budget=defaults.stats_budget_bytes, progress=progress)
        self.docs = {d.doc_id: (t, s) for d, t, s in zip(docs, tokens, stats)}
        self._bits_cache: dict = {}
        self.dense = []
        for spec in pset.prompts:
            p = self.prompt(spec, points[0])
            ids = torch.tensor([p.input_ids], device=lm.device)
            run = dense_prefill(lm, ids)
            logits, past, ms = run.logits, run.past, run.timing.wall_ms
            toks = greedy_generate(lm, logits, past, max_new_tokens)
            self.dense.append({"logits": logits, "tokens": toks, "ms": ms, "seq_len": p.layout.seq_len,
                               "text": lm.tokenizer.decode(toks, skip_special_tokens=True)})
            del past

    def bits(self, point: GridPoint, doc_id: str):
        key = (point, doc_id)
        if key not in self._bits_cache:
            la, ca = derive_bits(self.docs[doc_id][1], point.tile, point.alpha, point.beta, point.gamma)
            self._bits_cache[key] = (pack_doc(la, ca), float(la.sum()) / max(1, la.shape[0] * la.shape[1]
                                                                              * la.shape[2] * (la.shape[2] + 1) / 2),
                                     float(ca.float().mean()))
        return self._bits_cache[key]

    def prompt(self, spec, point: GridPoint):
        packed = [self.bits(point, d)[0] for d in spec.doc_ids]
        return build_prompt(self.lm, self.prefix, list(spec.doc_ids), [self.docs[d][0] for d in spec.doc_ids],
                            [p[0] for p in packed], [p[1] for p in packed], point.tile, spec.question)

    def densities(self, point: GridPoint, block_m: int, block_n: int) -> list[dict]:
        """Cell and block density of each prompt at `point` (decode only, no forward)."""
        out = []
        for spec in self.pset.prompts:
            p = self.prompt(spec, point)
            table = BlockTable.for_layout(p.layout, block_m, block_n)
            lays = [decode_layer(p.bits, layer, table) for layer in range(self.lm.n_layers)]
            cells, blocks = mean_densities(lays)
            out.append({"cells": cells, "blocks": blocks})
        return out

    def evaluate(self, point: GridPoint, backend, block_m: int, block_n: int, recall: bool = False) -> dict:
        lm = self.lm
        rows = []
        for spec, ref in zip(self.pset.prompts, self.dense):
            p = self.prompt(spec, point)
            ids = torch.tensor([p.input_ids], device=lm.device)
            s = sparse_prefill(lm, p, backend, ids, PrefillOptions(block_m=block_m, block_n=block_n),
                               "cuda" if backend.name == "cuda" else "torch")
            cmp = compare_logits(ref["logits"], s.logits)
            toks = greedy_generate(lm, s.logits, s.past, self.max_new_tokens)
            cells, blocks = mean_densities(s.plan.block_lists)
            rows.append({"cells": cells, "blocks": blocks,
                         "kl": cmp["kl"], "first_token_same": cmp["first_token_match"],
                         "same_answer": toks == ref["tokens"], "ttft_ms": s.ttft_ms, "dense_ms": ref["ms"],
                         "text": lm.tokenizer.decode(toks, skip_special_tokens=True), "tokens": p.layout.seq_len})
            del s
        docs = {d for spec in self.pset.prompts for d in spec.doc_ids}
        out = {**point.as_dict(), "n": len(rows),
               "density": statistics.fmean(r["cells"] for r in rows),
               "block_density": statistics.fmean(r["blocks"] for r in rows),
               "la_bit_density": statistics.fmean(self.bits(point, d)[1] for d in docs),
               "ca_bit_density": statistics.fmean(self.bits(point, d)[2] for d in docs),
               "kl_mean": statistics.fmean(r["kl"] for r in rows), "kl_max": max(r["kl"] for r in rows),
               "first_token_agreement": sum(r["first_token_same"] for r in rows) / len(rows),
               "same_answer": sum(r["same_answer"] for r in rows) / len(rows),
               "first_token_same_count": sum(r["first_token_same"] for r in rows),
               "same_answer_count": sum(r["same_answer"] for r in rows), "prompts": rows}
        if recall:
            r = self.recall([point], block_m, block_n)[0]
            out["la_recall"], out["ca_recall"] = r["la_recall"], r["ca_recall"]
            out["recall"] = min(x for x in (r["la_recall"], r["ca_recall"]) if x is not None) \
                if (r["la_recall"] is not None or r["ca_recall"] is not None) else None
        return out

    def recall(self, points: list[GridPoint], block_m: int, block_n: int) -> list[dict]:
        """Recall at several grid points with one dense forward per prompt."""
        L, H = self.lm.n_layers, self.lm.n_heads
        totals = [({k: np.zeros((L, H), dtype=np.int64) for k in COUNTS}, np.zeros((L, H))) for _ in points]
        budget = device_defaults(self.lm.device).stats_budget_bytes
        for spec in self.pset.prompts:
            probes = [RecallProbe(self.prompt(spec, pt), pt.alpha, pt.beta, block_m, block_n, budget)
                      for pt in points]

            def callback(layer, q, k, scale):
                for pr in probes:
                    pr(layer, q, k, scale)

            probe_forward(self.lm.model, probes[0].prompt.input_ids, callback)
            for (c, m), pr in zip(totals, probes):
                for key in COUNTS:
                    c[key] += pr.c[key]
                m += pr.mass
        return [summarize(c, m)["overall"] for c, m in totals]


def run_sweep(lm, pset: PromptSet, points: list[GridPoint], backend=None, block_m: int = 128, block_n: int = 64,
              max_new_tokens: int = 16, recall: bool = False, progress=None, ctx: SweepContext | None = None) -> dict:
    backend = backend or model_backend("auto", lm)
    ctx = ctx or SweepContext(lm, pset, points, max_new_tokens)
    rows = []
    for i, pt in enumerate(points):
        rows.append(ctx.evaluate(pt, backend, block_m, block_n, recall))
        if progress:
            progress(i + 1, len(points))
    return {"prompt_set": pset.describe(), "backend": backend.name, "block": [block_m, block_n],
            "max_new_tokens": max_new_tokens,
            "dense": [{"tokens": d["seq_len"], "ttft_ms": d["ms"], "text": d["text"]} for d in ctx.dense],
            "points": rows}


def sweep_report(model: ModelSpec, points: list[GridPoint], data: str | None = None, corpus: str | None = None,
                 data_dir=None, n_docs: int = 20, n_prompts: int = 3, docs_per_prompt: int = 3, words: int = 1600,
                 seed: int = 0, backend: str = "auto", block_m: int = 64, block_n: int = 64,
                 max_new_tokens: int = 16, recall: bool = False, progress_bar: ProgressBar = no_progress) -> dict:
    """`sift eval sweep`: every grid point on a built-in prompt set (`data`) or prompts sampled from `corpus`."""
    if (data is None) == (corpus is None):
        raise SiftError("give --data nq|essays or --corpus PATH")
    check_points(points)  # the points, the data and the corpus are checked before the model loads
    pset = builtin_prompt_set(data, data_dir, n_docs, n_prompts, seed, docs_per_prompt, words) if data else None
    docs = load_documents(corpus, CorpusFormat()) if corpus else None
    if docs is not None:
        check_document_count(docs, docs_per_prompt, str(corpus))
    lm = model.load()
    if corpus:
        pset = corpus_prompt_set(docs, CorpusFormat(), n_prompts, docs_per_prompt, None, seed, lm=lm,
                                 source=str(corpus))
    be = model_backend(backend, lm)
    with progress_bar("sweep") as prog:
        res = run_sweep(lm, pset, points, be, block_m, block_n, max_new_tokens, recall, progress=prog)
    res["run"] = run_metadata(lm)
    return res
