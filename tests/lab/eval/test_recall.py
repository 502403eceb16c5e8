"""Recall of the truly high attention cells, against brute force over eager probabilities."""

import numpy as np
import pytest

from sift_cli.block_lists import block_mask_for_layer, decode_layer, doc_ca_pages, doc_la_tiles
from sift_cli.block_table import BlockTable
from sift_cli.config import ProfileConfig
from sift_cli.lab.eval.prompt_sets import compose, ensure_shards
from sift_cli.lab.eval.recall import area_shares, run_recall

from ...helpers import eager_attentions


def _brute_recall(attns, prompt, alpha, beta):
    """Counts from full eager probability matrices (float64)."""
    lay, bits = prompt.layout, prompt.bits
    T, P0 = bits.tile, lay.prefix_len
    tot = {"la_high": 0, "la_high_sel": 0, "ca_high": 0, "ca_high_sel": 0, "la_true_tiles": 0, "la_sel_cells": 0,
           "la_high_blk": 0}
    table = BlockTable.for_layout(lay, 128, 64)
    row_block, key_block = (t.numpy() for t in table.token_blocks())
    for layer, A in enumerate(attns):
        blocks = block_mask_for_layer(bits, layer, table).numpy()
        for d, span in enumerate(lay.docs):
            la = doc_la_tiles(bits, d, layer).numpy()
            s, n = span.start, span.n_tokens
            Ad = A[:, s:s + n, s:s + n]
            causal = np.tril(np.ones((n, n), dtype=bool))
            high = (Ad >= alpha) & causal
            tiles = la[:, np.arange(n)[:, None] // T, np.arange(n)[None, :] // T] & causal
            blk = blocks[:, row_block[s + np.arange(n)][:, None], key_block[s + np.arange(n)][None, :]]
            tot["la_high"] += high.sum()
            tot["la_high_sel"] += (high & tiles).sum()
            tot["la_high_blk"] += (high & blk).sum()
            tot["la_sel_cells"] += tiles.sum()
            P = -(-n // T)
            for r in range(P):
                for c in range(r + 1):
                    tot["la_true_tiles"] += high[:, r * T:(r + 1) * T, c * T:(c + 1) * T].any(axis=(1, 2)).sum()
            if s > P0:
                Ac = A[:, s:s + n, P0:s]
                key_sel = np.zeros((A.shape[0], s - P0), dtype=bool)
                for m, sp in enumerate(lay.docs[:d]):
                    ca = doc_ca_pages(bits, m, layer).numpy()
                    key_sel[:, sp.start - P0: sp.end - P0] = ca[:, np.arange(sp.n_tokens) // T]
                hc = Ac >= beta
                tot["ca_high"] += hc.sum()
                tot["ca_high_sel"] += (hc & key_sel[:, None, :]).sum()
    return tot

def test_recall_counts_equal_brute_force(tmp_path, tiny_lm, pset):
    cfg = ProfileConfig(tile=16, alpha=2e-3, beta=2e-2, gamma=0.1)
    shards = ensure_shards(pset, tiny_lm, cfg, tmp_path / "work", num_shards=2)
    prompt = compose(shards, tiny_lm, pset.prompts[0])
    res = run_recall(tiny_lm, [prompt], cfg.alpha, cfg.beta, 128, 64)
    attns = eager_attentions(tiny_lm.model, prompt.input_ids)
    want = _brute_recall(attns, prompt, cfg.alpha, cfg.beta)
    o = res["overall"]
    L, H = tiny_lm.n_layers, tiny_lm.n_heads
    la_cells = L * H * sum(d.n_tokens * (d.n_tokens + 1) // 2 for d in prompt.layout.docs)
    slack = 2  # cells within float rounding of a threshold may flip between eager and the banded fp32 pass
    assert abs(o["la_recall"] * want["la_high"] - want["la_high_sel"]) <= slack
    assert abs(o["la_true_density"] * la_cells - want["la_high"]) <= slack
    assert abs(o["la_chosen_density"] * la_cells - want["la_sel_cells"]) <= slack
    assert abs(o["la_block_recall"] * want["la_high"] - want["la_high_blk"]) <= slack
    assert want["ca_high"] > 0 and abs(o["ca_recall"] * want["ca_high"] - want["ca_high_sel"]) <= slack
    assert 0 < o["attention_mass_kept"] <= 1 + 1e-6
    a = area_shares(prompt)
    assert abs(sum(a.values()) - 1) < 1e-9 and res["area"]["la"] == pytest.approx(a["la"])
    assert len(res["per_layer"]) == L

def test_recall_is_total_with_every_bit_set(tmp_path, tiny_lm, pset):
    shards = ensure_shards(pset, tiny_lm, ProfileConfig(tile=16, alpha=0.0, beta=0.0, gamma=0.0), tmp_path / "w",
                           num_shards=1)
    prompts = [compose(shards, tiny_lm, s) for s in pset.prompts]
    res = run_recall(tiny_lm, prompts, 1e-3, 1e-2)
    o = res["overall"]
    assert o["la_recall"] == 1.0 and o["ca_recall"] == 1.0 and o["la_chosen_density"] == 1.0
    assert o["attention_mass_kept"] == pytest.approx(1.0, abs=1e-5)
    assert decode_layer(prompts[0].bits, 0, BlockTable.for_layout(prompts[0].layout)).density() == 1.0
