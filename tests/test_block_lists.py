"""Block tables and decode_layer against a brute-force token-level construction of SPEC §6 (v2: blocks follow the
segments), the canonical list order, and cells_over_allowed counted by brute force."""

import numpy as np
import pytest
import torch

from sift_cli.attention.base import BlockLists
from sift_cli import block_lists as block_lists_module
from sift_cli.block_lists import (allowed_cells, block_mask_for_layer, cell_density, cells_over_allowed,
                                  computed_cells, decode_layer, decode_layers, dense_block_lists)
from sift_cli.block_table import BlockTable
from sift_cli.cuda.checks import awkward_layouts, random_case
from sift_cli.bits import pack_doc
from sift_cli.layout import PromptBits, PromptLayout, random_prompt_bits

AWKWARD = awkward_layouts()


def random_prompt(rng, tile, dense_p=0.0, **kw):
    """(bits, drawn arrays) on a random prompt of up to 4 documents of fewer than 5 tiles (`random_case`)."""
    return random_case(rng, tile, dense_p=dense_p, max_docs=4, max_doc_tiles=5, max_prefix=69, max_suffix=89, **kw)


def brute_force_token_mask(layout: PromptLayout, truth, tile, layer, n_heads):
    L = layout.seq_len
    allowed = np.zeros((n_heads, L, L), dtype=bool)
    allowed[:, : layout.prefix_len, :] = True  # prefix rows: everything (causality applied below)
    allowed[:, layout.docs_end:, :] = True  # suffix rows
    for d, span in enumerate(layout.docs):
        rows = slice(span.start, span.end)
        if truth[d] is None:  # a dense document: its rows see everything earlier
            allowed[:, rows, :] = True
            continue
        la = truth[d][0]
        allowed[:, rows, : layout.prefix_len] = True
        for e in range(d):
            prev = layout.docs[e]
            if truth[e] is None:  # later documents see all of a dense one
                allowed[:, rows, prev.start: prev.end] = True
                continue
            pages = truth[e][1][layer]  # CA pages of the earlier doc [H, P]
            cols = np.repeat(pages, tile, axis=1)[:, : prev.n_tokens]  # [H, n_prev]
            allowed[:, rows, prev.start: prev.end] |= cols[:, None, :]
        tok = np.repeat(np.repeat(la[layer], tile, axis=1), tile, axis=2)[:, : span.n_tokens, : span.n_tokens]
        allowed[:, rows, span.start: span.end] |= tok
    return allowed & np.tril(np.ones((L, L), dtype=bool))


def blocks_from_tokens(token_mask, table: BlockTable):
    """bool [H, M, N]: the table's blocks holding some allowed pair."""
    rows, keys = (t.numpy() for t in table.token_blocks())
    H = token_mask.shape[0]
    out = np.zeros((H, table.n_query_blocks, table.n_kv_blocks), dtype=bool)
    for h in range(H):
        i, j = np.nonzero(token_mask[h])
        out[h, rows[i], keys[j]] = True
    return out


@pytest.mark.parametrize("tile", [16, 64, 128, 256])
@pytest.mark.parametrize("blocks", [(128, 64), (128, 128), (64, 64)])
@pytest.mark.parametrize("query_blocks", ["segment", "grid"])
@pytest.mark.parametrize("dense_p", [0.0, 0.4])
def test_decode_matches_brute_force(tile, blocks, query_blocks, dense_p):
    """dense_p: the chance that a document has no bits (dense in both directions)."""
    rng = np.random.default_rng(tile * 1000 + blocks[0] + blocks[1])
    for trial in range(4):
        pb, truth = random_prompt(rng, tile, dense_p=dense_p)
        table = BlockTable.for_layout(pb.layout, *blocks, query_blocks)
        for layer in range(pb.n_layers):
            token_mask = brute_force_token_mask(pb.layout, truth, tile, layer, pb.n_heads)
            want = blocks_from_tokens(token_mask, table)
            assert (block_mask_for_layer(pb, layer, table).numpy() == want).all(), (trial, layer, pb.layout)
            lists = decode_layer(pb, layer, table)
            from_csr = BlockLists(lists.offsets, lists.indices, table)  # no cached mask
            assert (from_csr.dense_mask().numpy() == want).all()
            assert allowed_cells(pb, layer) == int(token_mask.sum())


@pytest.mark.parametrize("group_elements", [1, 700, 1 << 26])  # one layer at a time, a few, all at once
def test_layers_decoded_together_equal_one_at_a_time(monkeypatch, group_elements):
    monkeypatch.setattr(block_lists_module, "MASK_ELEMENTS", group_elements)
    rng = np.random.default_rng(group_elements)
    for trial in range(6):
        pb, _ = random_case(rng, 64, n_layers=5, n_heads=3, dense_p=0.3)
        table = BlockTable.for_layout(pb.layout, 128 if trial % 2 else 64, 64)
        together = decode_layers(pb, table, pb.n_layers)
        assert len(together) == pb.n_layers
        for layer, lists in enumerate(together):
            alone = decode_layer(pb, layer, table)
            assert torch.equal(lists.offsets, alone.offsets) and torch.equal(lists.indices, alone.indices)


@pytest.mark.parametrize("prefix,docs,suffix", AWKWARD)
@pytest.mark.parametrize("query_blocks", ["segment", "grid"])
@pytest.mark.parametrize("dense_p", [0.0, 0.5])
def test_awkward_segments(prefix, docs, suffix, query_blocks, dense_p):
    rng = np.random.default_rng(len(docs) + prefix)
    pb, truth = random_prompt(rng, 64, doc_lengths=docs, prefix_len=prefix, suffix_len=suffix, la_p=0.3, ca_p=0.3,
                              dense_p=dense_p)
    table = BlockTable.for_layout(pb.layout, 128, 64, query_blocks)
    rows, keys = (t.numpy() for t in table.token_blocks())
    causal = np.tril(np.ones((table.seq_len,) * 2, bool))
    layers, computed, allowed = [], 0, 0
    for layer in range(pb.n_layers):
        token_mask = brute_force_token_mask(pb.layout, truth, 64, layer, pb.n_heads)
        lists = decode_layer(pb, layer, table)
        assert (lists.dense_mask().numpy() == blocks_from_tokens(token_mask, table)).all()
        cells = int((lists.dense_mask().numpy()[:, rows][:, :, keys] & causal).sum())
        assert computed_cells(lists) == cells
        layers.append(lists)
        computed += cells
        allowed += int(token_mask.sum())
    # SPEC §6's fidelity measure, by brute force: causal pairs inside listed blocks over allowed pairs
    assert cells_over_allowed(pb, layers) == pytest.approx(computed / allowed)


@pytest.mark.parametrize("prefix,docs,suffix", AWKWARD)
def test_tile_sized_segment_blocks_compute_exactly_the_allowed_cells(prefix, docs, suffix):
    """With query and KV blocks both cut per segment at the tile size (64), every block is one (tile row, tile or
    page) cell of the bits, so SPEC §6's measure is exactly 1."""
    rng = np.random.default_rng(prefix + len(docs))
    pb, _ = random_prompt(rng, 64, doc_lengths=docs, prefix_len=prefix, suffix_len=suffix, la_p=0.3, ca_p=0.3,
                          dense_p=0.3)
    table = BlockTable.for_layout(pb.layout, 64, 64, "segment")
    assert cells_over_allowed(pb, [decode_layer(pb, layer, table) for layer in range(pb.n_layers)]) == 1.0


def test_table_blocks_follow_segments():
    lay = PromptLayout.build(16, ["a", "b"], [130, 64], 20)
    t = BlockTable.for_layout(lay, 128, 64)
    assert t.kv_start.tolist() == [0, 16, 80, 144, 146, 210]
    assert t.kv_len.tolist() == [16, 64, 64, 2, 64, 20]
    assert t.kv_doc.tolist() == [-1, 0, 0, 0, 1, 2]
    assert t.q_start.tolist() == [0, 16, 144, 146, 210] and t.q_len.tolist() == [16, 128, 2, 64, 20]
    g = BlockTable.for_layout(lay, 128, 64, "grid")
    assert g.q_start.tolist() == [0, 128] and g.q_len.tolist() == [128, 102]
    assert int(t.causal_cells().sum()) == lay.seq_len * (lay.seq_len + 1) // 2


def test_block_cut_matches_a_loop_over_segments():
    """BlockTable's vectorised cut of segments into blocks equals cutting each segment in turn."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        prefix, suffix = int(rng.choice([0, 1, 16, 63, 64])), int(rng.choice([0, 1, 20, 129]))
        docs = [int(x) for x in rng.choice([1, 63, 64, 65, 127, 128, 129, 300], size=rng.integers(0, 6))]
        lay = PromptLayout.build(prefix, [f"d{i}" for i in range(len(docs))], docs, suffix)
        segments = ([(0, prefix, -1)] if prefix else []) + [(d.start, d.n_tokens, i) for i, d in enumerate(lay.docs)]
        segments += [(lay.docs_end, suffix, len(docs))] if suffix else []
        for bm, bn in ((128, 64), (64, 128)):
            t = BlockTable.for_layout(lay, bm, bn)
            want = [(s + o, min(bn, n - o), owner) for s, n, owner in segments for o in range(0, n, bn)]
            assert list(zip(t.kv_start.tolist(), t.kv_len.tolist(), t.kv_doc.tolist())) == want
            assert list(zip(t.q_start.tolist(), t.q_len.tolist())) == [
                (s + o, min(bm, n - o)) for s, n, _ in segments for o in range(0, n, bm)]


def test_lists_are_canonical_and_consistent():
    """Per row: the blocks that need a mask (partial, or reaching past the row block's first row) first, then the
    rest, each group descending; the diagonal block leads."""
    rng = np.random.default_rng(3)
    pb, _ = random_prompt(rng, 64, doc_lengths=[300, 500, 129], prefix_len=40, suffix_len=70)
    for query_blocks in ("segment", "grid"):
        table = BlockTable.for_layout(pb.layout, 128, 64, query_blocks)
        lists = decode_layer(pb, 1, table)
        need = table.needs_mask()
        off, idx = lists.offsets.long(), lists.indices.long()
        H, M1 = off.shape
        assert off[0, 0] == 0 and off[-1, -1] == idx.numel()
        assert (off[1:, 0] == off[:-1, -1]).all()
        last = table.last_causal_kv_block()
        for h in range(H):
            for m in range(M1 - 1):
                row = idx[off[h, m]: off[h, m + 1]]
                assert row.numel() >= 1
                flags = need[m, row]
                n_mask = int(flags.sum())
                assert flags[:n_mask].all() and not flags[n_mask:].any()  # masked group first
                for part in (row[:n_mask], row[n_mask:]):
                    assert (part[:-1] > part[1:]).all()  # each group strictly descending
                assert int(row[0]) == int(last[m])  # diagonal block first


def test_all_bits_set_is_dense():
    rng = np.random.default_rng(11)
    pb, _ = random_prompt(rng, 64, doc_lengths=[200, 77, 400], la_p=1.1, ca_p=1.1)
    table = BlockTable.for_layout(pb.layout, 128, 64)
    lists = decode_layer(pb, 0, table)
    dense = dense_block_lists(table, pb.n_heads)
    assert torch.equal(lists.offsets, dense.offsets) and torch.equal(lists.indices, dense.indices)
    assert lists.density() == 1.0 and abs(cell_density(lists) - 1.0) < 1e-12
    assert cells_over_allowed(pb, [decode_layer(pb, layer, table) for layer in range(pb.n_layers)]) == 1.0


@pytest.mark.parametrize("L", [1, 63, 64, 65, 127, 128, 129, 1000])
def test_causal_cells(L):
    table = BlockTable.causal(L, 128, 64)
    cells = table.causal_cells()
    assert int(cells.sum()) == L * (L + 1) // 2
    ref = blocks_from_tokens(np.tril(np.ones((1, L, L), dtype=bool)), table)
    assert ((cells.numpy() > 0) == ref[0]).all()
    assert table.causal_block_count() == int(ref.sum())


def test_a_dense_document_lies_between_profiled_and_dense():
    """The same bits with one document's dropped: density above the all-profiled prompt's, below 1; with every
    document's dropped: dense."""
    layout = PromptLayout.build(16, [f"d{i}" for i in range(6)], [300, 500, 129, 700, 64, 400], 40)
    table = BlockTable.for_layout(layout, 128, 64)
    _, drawn = random_prompt_bits(layout, 64, 2, 3, 0.2, 0.2, np.random.default_rng(1))
    blobs = [pack_doc(la, ca) for la, ca in drawn]

    def density(dense):
        la = [None if d in dense else b[0] for d, b in enumerate(blobs)]
        ca = [None if d in dense else b[1] for d, b in enumerate(blobs)]
        pb = PromptBits.pack(layout, la, ca, 64, 2, 3)
        assert pb.dense_docs() == sorted(dense)
        return cell_density(decode_layer(pb, 1, table))

    profiled, one, every = density(set()), density({3}), density(set(range(6)))
    assert profiled < one < 1.0
    assert every == pytest.approx(1.0)
