"""Recall of the truly high attention cells of composed prompts by the stored bits (paper §3.2, §3.4, Figs. 8, 10).

For each prompt `prefix ‖ doc_1 ‖ … ‖ doc_n ‖ suffix` the model runs its dense forward; for every layer and head
the softmax probabilities of the document rows are computed in fp32, a band of rows at a time (never an L×L
matrix per head for the whole model). A cell (i, j) is *truly high*

- LA: i and j in the same document, j ≤ i, A[i, j] ≥ α;
- CA: i in a document, j in an earlier document, A[i, j] ≥ β.

Recall is the share of truly high cells that the stored bits select (LA: the cell's tile is set in its
document's LA vector; CA: the key's page is set in its document's CA vector). `*_block_recall` is the same against
the block mask the kernel actually computes (tiles widened to BLOCK_M × BLOCK_N). Densities are reported both ways:
chosen (cells inside selected tiles / pages) against true (truly high cells), over the LA area (causal cells
inside documents) and the CA area (later-document rows × earlier-document keys); tile- and page-level truth
(tiles holding at least one truly high cell, pages holding a key that receives one) beside them.
`attention_mass_kept` is the share of each document row's probability mass that falls in computed blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...block_lists import block_mask_for_layer, doc_ca_pages, doc_la_tiles
from ...block_table import BlockTable
from ...config import CPU_DEFAULTS, device_defaults, resolve_profile_config
from ...errors import SiftError
from ...prefill.assemble import Prompt
from ...shards.reader import ShardSet
from ..runs import ModelSpec, ProgressBar, no_progress, run_metadata
from .probe import probe_forward
from .prompt_sets import builtin_prompt_set, compose, ensure_shards, read_prompt_file

COUNTS = ("la_cells", "la_high", "la_high_sel", "la_high_blk", "la_sel_cells", "la_tiles", "la_sel_tiles",
          "la_true_tiles", "ca_cells", "ca_high", "ca_high_sel", "ca_high_blk", "ca_sel_cells", "ca_pages",
          "ca_sel_pages", "ca_true_pages", "doc_rows")
RATIOS = {  # reported name: (numerator count, denominator count)
    "la_recall": ("la_high_sel", "la_high"), "la_block_recall": ("la_high_blk", "la_high"),
    "ca_recall": ("ca_high_sel", "ca_high"), "ca_block_recall": ("ca_high_blk", "ca_high"),
    "la_chosen_density": ("la_sel_cells", "la_cells"), "la_true_density": ("la_high", "la_cells"),
    "la_chosen_tile_density": ("la_sel_tiles", "la_tiles"), "la_true_tile_density": ("la_true_tiles", "la_tiles"),
    "ca_chosen_density": ("ca_sel_cells", "ca_cells"), "ca_true_density": ("ca_high", "ca_cells"),
    "ca_chosen_page_density": ("ca_sel_pages", "ca_pages"), "ca_true_page_density": ("ca_true_pages", "ca_pages"),
}


def doc_masks(prompt: Prompt, layer: int):
    """Per document of `prompt`: (LA tiles bool [H, P, P], CA pages bool [H, P]) at one layer."""
    return [(doc_la_tiles(prompt.bits, d, layer), doc_ca_pages(prompt.bits, d, layer))
            for d in range(len(prompt.layout.docs))]


class RecallProbe:
    """Callback for `probe.probe_forward`: accumulates counts [layer, head] for one prompt."""

    def __init__(self, prompt: Prompt, alpha: float, beta: float, block_m: int = 128, block_n: int = 64,
                 budget_bytes: int = CPU_DEFAULTS.stats_budget_bytes):
        self.prompt, self.alpha, self.beta = prompt, alpha, beta
        self.block_m, self.block_n, self.budget = block_m, block_n, budget_bytes
        L, H = prompt.bits.n_layers, prompt.bits.n_heads
        self.c = {k: np.zeros((L, H), dtype=np.int64) for k in COUNTS}
        self.mass = np.zeros((L, H), dtype=np.float64)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        lay, bits = self.prompt.layout, self.prompt.bits
        T, P0, S = bits.tile, lay.prefix_len, lay.seq_len
        H, dev = q.shape[0], q.device
        group = H // k.shape[0]
        masks = [(la.to(dev), ca.to(dev)) for la, ca in doc_masks(self.prompt, layer)]
        table = BlockTable.for_layout(lay, self.block_m, self.block_n, device=dev)
        blocks = block_mask_for_layer(bits, layer, table).to(dev)  # [H, M, N]
        row_block, key_block = table.token_blocks()
        ca_key = torch.zeros(H, S, dtype=torch.bool, device=dev)  # key j's page is CA-selected
        for (_, ca), span in zip(masks, lay.docs):
            ca_key[:, span.start:span.end] = ca.repeat_interleave(T, 1)[:, :span.n_tokens]
        key_hit = torch.zeros(H, S, dtype=torch.bool, device=dev)  # CA keys that receive a truly high cell
        pos = torch.arange(S, device=dev)
        heads = max(1, min(H, self.budget // (16 * S * T)))
        c = self.c
        for h0 in range(0, H, heads):
            h1 = min(H, h0 + heads)
            hs = slice(h0, h1)
            qh = q[h0:h1].float()
            kh = k[torch.arange(h0, h1, device=dev) // group].float()
            rows = max(T, self.budget // (16 * S * (h1 - h0)) // T * T)
            for (la, _), span in zip(masks, lay.docs):
                s0, n = span.start, span.n_tokens
                P = la.shape[-1]
                for r0 in range(0, n, rows):
                    r1 = min(n, r0 + rows)
                    R, K = r1 - r0, s0 + r1
                    gi = pos[s0 + r0:s0 + r1]  # global rows
                    scores = torch.matmul(qh[:, s0 + r0:s0 + r1], kh[:, :K].transpose(1, 2)).mul_(scale)
                    causal = pos[None, :K] <= gi[:, None]  # [R, K]
                    scores.masked_fill_(~causal, float("-inf"))
                    p = torch.softmax(scores, dim=-1)
                    del scores
                    blk = blocks[h0:h1][:, row_block[gi]][:, :, key_block[:K]] & causal  # [h, R, K]
                    self.mass[layer, hs] += (p * blk).sum((1, 2), dtype=torch.float64).cpu().numpy()
                    c["doc_rows"][layer, hs] += R
                    # LA: same document, causal
                    pl, cl, bl = p[:, :, s0:K], causal[:, s0:K], blk[:, :, s0:K]
                    high = (pl >= self.alpha) & cl
                    lt = torch.arange(r0, r1, device=dev) // T
                    ct = torch.arange(r1, device=dev) // T
                    sel = la[h0:h1][:, lt][:, :, ct] & cl
                    _add(c["la_high"], layer, hs, high.sum((1, 2)))
                    _add(c["la_high_sel"], layer, hs, (high & sel).sum((1, 2)))
                    _add(c["la_high_blk"], layer, hs, (high & bl).sum((1, 2)))
                    _add(c["la_sel_cells"], layer, hs, sel.sum((1, 2)))
                    # tiles holding a truly high cell (rows are tile-aligned: r0 is a multiple of T)
                    hp = F.pad(high, (0, P * T - r1, 0, -(-R // T) * T - R))
                    tile_hit = hp.view(h1 - h0, -(-R // T), T, P, T).any(4).any(2)
                    _add(c["la_true_tiles"], layer, hs, tile_hit.sum((1, 2)))
                    # CA: keys of earlier documents
                    if s0 > P0:
                        pc, bc = p[:, :, P0:s0], blk[:, :, P0:s0]
                        hc = pc >= self.beta
                        selk = ca_key[h0:h1, P0:s0]
                        _add(c["ca_high"], layer, hs, hc.sum((1, 2)))
                        _add(c["ca_high_sel"], layer, hs, (hc & selk[:, None, :]).sum((1, 2)))
                        _add(c["ca_high_blk"], layer, hs, (hc & bc).sum((1, 2)))
                        _add(c["ca_sel_cells"], layer, hs, selk.sum(1) * R)
                        key_hit[h0:h1, P0:s0] |= hc.any(1)
                    del p, blk
        # per-document totals, the same for every head
        for d, ((la, ca), span) in enumerate(zip(masks, lay.docs)):
            n, P = span.n_tokens, la.shape[-1]
            c["la_cells"][layer] += n * (n + 1) // 2
            c["la_tiles"][layer] += P * (P + 1) // 2
            c["la_sel_tiles"][layer] += la.tril().sum((1, 2)).cpu().numpy()
            c["ca_cells"][layer] += n * (span.start - P0)
            if d < len(lay.docs) - 1:  # pages that later documents can attend to
                c["ca_pages"][layer] += P
                c["ca_sel_pages"][layer] += ca.sum(1).cpu().numpy()
                hit = F.pad(key_hit[:, span.start:span.end], (0, P * T - n)).view(H, P, T).any(-1)
                c["ca_true_pages"][layer] += hit.sum(1).cpu().numpy()


def _add(arr: np.ndarray, layer: int, hs: slice, value: torch.Tensor) -> None:
    arr[layer, hs] += value.to(torch.int64).cpu().numpy()


def area_shares(prompt: Prompt) -> dict:
    """Shares of the causal attention area: always dense (prefix and suffix rows, document rows × prefix keys),
    LA (inside documents), CA (later documents × earlier documents)."""
    lay = prompt.layout
    S = lay.seq_len
    total = S * (S + 1) / 2
    la = sum(d.n_tokens * (d.n_tokens + 1) / 2 for d in lay.docs)
    ca = sum(d.n_tokens * (d.start - lay.prefix_len) for d in lay.docs)
    return {"dense": 1 - (la + ca) / total, "la": la / total, "ca": ca / total}


def _ratio(a, b) -> float | None:
    a, b = float(np.sum(a)), float(np.sum(b))
    return a / b if b else None


def summarize(c: dict, mass: np.ndarray) -> dict:
    """Counts [L, H] (summed over prompts) → overall and per-layer recall and densities."""

    def block(sel) -> dict:
        g = {k: v[sel] for k, v in c.items()}
        out = {name: _ratio(g[num], g[den]) for name, (num, den) in RATIOS.items()}
        out["attention_mass_kept"] = float(np.sum(mass[sel])) / max(1, int(np.sum(g["doc_rows"])))
        return out

    overall = block(np.s_[:, :])
    per_layer = []
    for layer in range(c["la_cells"].shape[0]):
        row = {"layer": layer, **block(np.s_[layer, :])}
        tiles = c["la_tiles"][layer]
        head_density = c["la_sel_tiles"][layer] / np.maximum(1, tiles)
        q = np.percentile(head_density, [0, 25, 50, 75, 100])
        row["la_tile_density_heads"] = {"min": q[0], "q1": q[1], "median": q[2], "q3": q[3], "max": q[4]}
        pages = c["ca_pages"][layer]
        row["ca_page_density_heads"] = dict(zip(("min", "q1", "median", "q3", "max"),
                                                np.percentile(c["ca_sel_pages"][layer] / np.maximum(1, pages),
                                                              [0, 25, 50, 75, 100]).tolist()))
        row["la_tile_density_heads"] = {k: float(v) for k, v in row["la_tile_density_heads"].items()}
        per_layer.append(row)
    for key in list(overall):
        if key.endswith("density") and overall[key] is not None:
            overall[key.replace("density", "sparsity")] = 1 - overall[key]
    return {"overall": overall, "per_layer": per_layer}


def run_recall(lm, prompts: list[Prompt], alpha: float, beta: float, block_m: int = 128, block_n: int = 64,
               progress=None) -> dict:
    """Recall over `prompts` (all layers and heads); counts are summed over prompts before the ratios."""
    L, H = lm.n_layers, lm.n_heads
    total = {k: np.zeros((L, H), dtype=np.int64) for k in COUNTS}
    mass = np.zeros((L, H))
    per_prompt, areas = [], []
    budget = device_defaults(lm.device).stats_budget_bytes
    for i, prompt in enumerate(prompts):
        probe = RecallProbe(prompt, alpha, beta, block_m, block_n, budget)
        probe_forward(lm.model, prompt.input_ids, probe)
        for k in COUNTS:
            total[k] += probe.c[k]
        mass += probe.mass
        s = summarize(probe.c, probe.mass)["overall"]
        areas.append(area_shares(prompt))
        per_prompt.append({"doc_ids": prompt.doc_ids, "tokens": prompt.layout.seq_len, **s})
        if progress:
            progress(i + 1, len(prompts))
    out = summarize(total, mass)
    out["area"] = {k: float(np.mean([a[k] for a in areas])) for k in ("dense", "la", "ca")}
    out["prompts"] = per_prompt
    out["thresholds"] = {"tile_size": prompts[0].bits.tile if prompts else None, "alpha": alpha, "beta": beta}
    out["block"] = [block_m, block_n]
    out["paper"] = {"model": "Llama-3-8B, 50 LongBench samples", "la_recall": 0.9389, "la_chosen_sparsity": 0.727,
                    "la_true_sparsity": 0.764, "ca_recall": 0.8012, "ca_chosen_sparsity": 0.942,
                    "ca_true_sparsity": 0.996}
    return out


def recall_report(model: ModelSpec, shards: Path | None = None, prompts: Path | None = None, data: str | None = None,
                  data_dir=None, n_docs: int = 20, n_prompts: int = 6, docs_per_prompt: int = 3, words: int = 1600,
                  seed: int = 0, tile: int = 64, alpha: float = 1e-3, beta: float = 1e-2, gamma: float = 0.10,
                  block_m: int = 128, block_n: int = 64, work: Path | None = None,
                  progress_bar: ProgressBar = no_progress) -> dict:
    """`sift eval recall`: prompts over a shard set (`shards` + a `prompts` file, at the shards' thresholds) or a
    built-in prompt set (`data`: nq or essays, profiled here at the given thresholds)."""
    if (shards is None) == (data is None):
        raise SiftError("give either --shards DIR --prompts FILE, or --data nq|essays")
    if data is not None:  # the data, the shards and the prompts are read before the model loads
        pset = builtin_prompt_set(data, data_dir, n_docs, n_prompts, seed, docs_per_prompt, words)
    else:
        if prompts is None:
            raise SiftError("--shards needs --prompts FILE — give the prompts as JSONL of {\"doc_ids\": [...], "
                            "\"question\": ...}")
        sh, specs = ShardSet(shards), read_prompt_file(prompts)
        source = {"shards": str(shards), "prompts": str(prompts)}
        if sh.meta.get("sift.alpha") is not None:  # a mass-rule set has no thresholds: "truly high" is --alpha, --beta
            alpha, beta = float(sh.meta["sift.alpha"]), float(sh.meta["sift.beta"])
        source["rule"] = sh.meta.get("sift.rule") or "paper"
    lm = model.load()
    if data is not None:
        cfg = resolve_profile_config(lm.device, {"tile": tile, "alpha": alpha, "beta": beta, "gamma": gamma}).profile
        with progress_bar("profiling") as prog:
            sh = ensure_shards(pset, lm, cfg, work, progress=prog)
        specs, source = pset.prompts, pset.describe()
    built = [compose(sh, lm, s) for s in specs]
    with progress_bar("recall") as prog:
        res = run_recall(lm, built, alpha, beta, block_m, block_n, progress=prog)
    res["source"], res["run"] = source, run_metadata(lm)
    return res
