"""decode_layer against a brute-force token-level construction of SPEC §6."""

import numpy as np
import pytest
import torch

from sift_cli.attention.base import BlockLists
from sift_cli.block_lists import (block_mask_for_layer, causal_cells_per_block, cell_density, decode_layer,
                             dense_block_lists)
from sift_cli.layout import PromptLayout, random_prompt_bits


def random_prompt(rng, tile, n_layers=2, n_heads=3, doc_lengths=None, prefix_len=None, suffix_len=None,
                  la_p=0.3, ca_p=0.3):
    if doc_lengths is None:
        doc_lengths = [int(x) for x in rng.integers(1, 5 * tile, size=int(rng.integers(1, 5)))]
    prefix_len = int(rng.integers(0, 70)) if prefix_len is None else prefix_len
    suffix_len = int(rng.integers(0, 90)) if suffix_len is None else suffix_len
    layout = PromptLayout.build(prefix_len, [f"d{i}" for i in range(len(doc_lengths))], doc_lengths, suffix_len)
    return random_prompt_bits(layout, tile, n_layers, n_heads, la_p, ca_p, rng)


def brute_force_token_mask(layout: PromptLayout, truth, tile, layer, n_heads):
    L = layout.seq_len
    allowed = np.zeros((n_heads, L, L), dtype=bool)
    allowed[:, : layout.prefix_len, :] = True  # prefix rows: everything (causality applied below)
    allowed[:, layout.docs_end:, :] = True  # suffix rows
    for d, span in enumerate(layout.docs):
        la = truth[d][0]
        rows = slice(span.start, span.end)
        allowed[:, rows, : layout.prefix_len] = True
        for e in range(d):
            prev = layout.docs[e]
            pages = truth[e][1][layer]  # CA pages of the earlier doc [H, P]
            cols = np.repeat(pages, tile, axis=1)[:, : prev.n_tokens]  # [H, n_prev]
            allowed[:, rows, prev.start: prev.end] |= cols[:, None, :]
        tok = np.repeat(np.repeat(la[layer], tile, axis=1), tile, axis=2)[:, : span.n_tokens, : span.n_tokens]
        allowed[:, rows, span.start: span.end] |= tok
    return allowed & np.tril(np.ones((L, L), dtype=bool))


def blocks_from_tokens(token_mask, block_m, block_n):
    H, L, _ = token_mask.shape
    M, N = -(-L // block_m), -(-L // block_n)
    padded = np.zeros((H, M * block_m, N * block_n), dtype=bool)
    padded[:, :L, :L] = token_mask
    return padded.reshape(H, M, block_m, N, block_n).any(axis=(2, 4))


@pytest.mark.parametrize("tile", [16, 64, 128, 256])
@pytest.mark.parametrize("blocks", [(128, 64), (128, 128), (64, 64)])
def test_decode_matches_brute_force(tile, blocks):
    rng = np.random.default_rng(tile * 1000 + blocks[0] + blocks[1])
    block_m, block_n = blocks
    for trial in range(6):
        pb, truth = random_prompt(rng, tile)
        for layer in range(pb.n_layers):
            want = blocks_from_tokens(brute_force_token_mask(pb.layout, truth, tile, layer, pb.n_heads),
                                      block_m, block_n)
            got = block_mask_for_layer(pb, layer, block_m, block_n).numpy()
            assert (got == want).all(), (trial, layer, pb.layout)
            lay = decode_layer(pb, layer, block_m, block_n)
            from_csr = BlockLists(lay.offsets, lay.indices, block_m, block_n, lay.seq_len)  # no cached mask
            assert (from_csr.dense_mask().numpy() == want).all()


def test_short_unaligned_segments():
    rng = np.random.default_rng(7)
    pb, truth = random_prompt(rng, 16, doc_lengths=[1, 5, 17, 3, 130, 2], prefix_len=13, suffix_len=1,
                              la_p=0.2, ca_p=0.5)
    for layer in range(pb.n_layers):
        want = blocks_from_tokens(brute_force_token_mask(pb.layout, truth, 16, layer, pb.n_heads), 128, 64)
        assert (block_mask_for_layer(pb, layer).numpy() == want).all()


def test_csr_is_descending_and_consistent():
    rng = np.random.default_rng(3)
    pb, _ = random_prompt(rng, 64, doc_lengths=[300, 500, 129], prefix_len=40, suffix_len=70)
    lay = decode_layer(pb, 1)
    off, idx = lay.offsets.long(), lay.indices.long()
    H, M1 = off.shape
    assert off[0, 0] == 0 and off[-1, -1] == idx.numel()
    assert (off[1:, 0] == off[:-1, -1]).all()
    for h in range(H):
        for m in range(M1 - 1):
            row = idx[off[h, m]: off[h, m + 1]]
            assert row.numel() >= 1
            assert (row[:-1] > row[1:]).all()  # strictly descending
            diag = min((m + 1) * 128, lay.seq_len) - 1
            assert int(row[0]) == diag // 64  # diagonal block first


def test_all_bits_set_is_dense():
    rng = np.random.default_rng(11)
    pb, _ = random_prompt(rng, 64, doc_lengths=[200, 77, 400], la_p=1.1, ca_p=1.1)
    lay = decode_layer(pb, 0)
    dense = dense_block_lists(pb.layout.seq_len, pb.n_heads)
    assert torch.equal(lay.offsets, dense.offsets) and torch.equal(lay.indices, dense.indices)
    assert lay.density() == 1.0 and abs(cell_density(lay) - 1.0) < 1e-12


@pytest.mark.parametrize("L", [1, 63, 64, 65, 127, 128, 129, 1000])
def test_causal_cells(L):
    cells = causal_cells_per_block(L, 128, 64)
    assert int(cells.sum()) == L * (L + 1) // 2
    ref = blocks_from_tokens(np.tril(np.ones((1, L, L), dtype=bool)), 128, 64)
    assert ((cells.numpy() > 0) == ref[0]).all()
