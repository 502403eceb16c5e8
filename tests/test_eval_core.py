"""Evaluation building blocks against brute force: the banded reference, threshold-free statistics, recall."""

import numpy as np
import pytest
import torch

from sift_cli.attention.reference import (ReferenceBackend, banded_block_sparse_attention,
                                         block_sparse_attention)
from sift_cli.corpus import Document
from sift_cli.block_lists import block_mask_for_layer, decode_layer, doc_ca_pages, doc_la_tiles, block_lists_from_mask
from sift_cli.eval.common import PromptSet, PromptSpec, compose, ensure_shards
from sift_cli.eval.backend import eval_backend
from sift_cli.eval.recall import area_shares, run_recall
from sift_cli.eval.thresholds import collect_stats, derive_bits
from sift_cli.models import tokenize_documents
from sift_cli.models import prefix_token_ids
from sift_cli.config import ProfileConfig
from sift_cli.profile.forward import profile_batch

from .helpers import TRAINING_TEXT, eager_attentions


def _docs(n=6):
    out = {}
    for i in range(n):
        text = " ".join(TRAINING_TEXT[(i + j) % len(TRAINING_TEXT)] for j in range(1 + (i * 3) % 5))
        out[f"d{i}"] = Document(f"d{i}", text + "\n\n", "test")
    return out


@pytest.fixture(scope="module")
def pset():
    docs = _docs()
    return PromptSet("tiny", docs, [PromptSpec(("d0", "d3", "d5", "d1"), "What jumps over the dog?", ("fox",)),
                                    PromptSpec(("d4", "d2"), "Who judges my vow?", ("sphinx",))])


@pytest.mark.parametrize("L,bm,bn,H,Hkv,rows", [(200, 128, 64, 4, 2, 128), (333, 64, 64, 6, 3, 64),
                                                 (129, 128, 128, 2, 2, 512)])
def test_banded_reference_equals_reference(L, bm, bn, H, Hkv, rows):
    torch.manual_seed(L)
    M, N = -(-L // bm), -(-L // bn)
    mask = torch.rand(H, M, N) < 0.4
    q_last = torch.clamp(torch.arange(M) * bm + bm, max=L) - 1
    k_first = torch.arange(N) * bn
    mask &= (k_first[None, :] <= q_last[:, None])[None]
    mask |= ((k_first[None, :] <= q_last[:, None]) & (k_first[None, :] + bn > q_last[:, None] - bm + 1))[None]
    lay = block_lists_from_mask(mask, bm, bn, L)
    q, k, v = torch.randn(H, L, 16), torch.randn(Hkv, L, 16), torch.randn(Hkv, L, 16)
    a = banded_block_sparse_attention(q, k, v, lay, 0.3, rows=rows)
    b = block_sparse_attention(q, k, v, lay, 0.3)
    assert torch.allclose(a, b, atol=2e-6), (a - b).abs().max()
    assert eval_backend("auto", torch.device("cpu")).name == "reference"
    banded = eval_backend("reference", torch.device("cpu"))
    assert isinstance(banded, ReferenceBackend) and banded.rows is not None


@pytest.mark.parametrize("tile,alpha,beta,gamma", [(16, 1e-3, 1e-2, 0.1), (32, 1e-2, 3e-2, 0.3),
                                                   (64, 3e-3, 1e-2, 0.05), (16, 0.0, 0.0, 0.0)])
def test_threshold_free_statistics_give_the_profile_bits(tiny_lm, tile, alpha, beta, gamma):
    docs = list(_docs().values())
    tokens = tokenize_documents(tiny_lm.tokenizer, docs)
    prefix = prefix_token_ids(tiny_lm.tokenizer)
    stats = collect_stats(tiny_lm.model, prefix, tokens, 16, (0.0, 1e-2, 3e-2))
    want = profile_batch(tiny_lm.model, prefix, tokens, ProfileConfig(tile=tile, alpha=alpha, beta=beta, gamma=gamma))
    for st, w in zip(stats, want):
        la, ca = derive_bits(st, tile, alpha, beta, gamma)
        assert torch.equal(la, w.la_tiles), "LA bits differ"
        assert torch.equal(ca, w.ca_pages), "CA bits differ"


def _brute_recall(attns, prompt, alpha, beta):
    """Counts from full eager probability matrices (float64)."""
    lay, bits = prompt.layout, prompt.bits
    T, P0 = bits.tile, lay.prefix_len
    tot = {"la_high": 0, "la_high_sel": 0, "ca_high": 0, "ca_high_sel": 0, "la_true_tiles": 0, "la_sel_cells": 0,
           "la_high_blk": 0}
    for layer, A in enumerate(attns):
        blocks = block_mask_for_layer(bits, layer, 128, 64).numpy()
        for d, span in enumerate(lay.docs):
            la = doc_la_tiles(bits, d, layer).numpy()
            s, n = span.start, span.n_tokens
            Ad = A[:, s:s + n, s:s + n]
            causal = np.tril(np.ones((n, n), dtype=bool))
            high = (Ad >= alpha) & causal
            tiles = la[:, np.arange(n)[:, None] // T, np.arange(n)[None, :] // T] & causal
            blk = blocks[:, (s + np.arange(n))[:, None] // 128, (s + np.arange(n))[None, :] // 64]
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
    assert decode_layer(prompts[0].bits, 0).density() == 1.0
