"""The flex backend's BlockMask on the prompt's own block table (`flex_layout`): the padded layout and its lists
state the same semantics as the reference (checked eagerly on CPU), and a listed block is "full" only where Flex
may skip the mask_mod."""

import numpy as np
import pytest
import torch

from sift_cli.attention.flex_layout import FlexLayout, block_mask_on_table, whole_causal_blocks
from sift_cli.attention.reference import block_sparse_attention
from sift_cli.block_lists import decode_layer
from sift_cli.block_table import BlockTable
from sift_cli.cuda.checks import random_block_lists, random_case_bits

flex = pytest.importorskip("torch.nn.attention.flex_attention")


def _cases():
    rng = np.random.default_rng(0)
    cases = [random_block_lists(BlockTable.causal(L, 128, bn), 4, 0.3) for L, bn in ((256, 64), (300, 128))]
    bits = random_case_bits(rng, 64, n_layers=1, n_heads=4, doc_lengths=[65, 130, 1, 200], prefix_len=16,
                            suffix_len=20)
    for qmode in ("segment", "grid"):
        cases.append(decode_layer(bits, 0, BlockTable.for_layout(bits.layout, 128, 64, qmode)))
    cases.append(decode_layer(bits, 0, BlockTable.for_layout(bits.layout, 64, 64)))
    return cases


@pytest.mark.parametrize("case", range(5))
def test_flex_on_the_block_table_matches_the_reference(case):
    """Flex's lists are the listed blocks; its mask_mod with them (eager Flex evaluates only the mask_mod, so the
    lists are added to it here as the compiled kernel applies them) gives the reference's output."""
    torch.manual_seed(case)
    lists = _cases()[case]
    L = lists.seq_len
    q, k, v = torch.randn(4, L, 32), torch.randn(2, L, 32), torch.randn(2, L, 32)
    mask, layout = block_mask_on_table(lists)
    listed = lists.dense_mask()
    assert torch.equal(mask.to_dense()[0].bool(), listed)
    bm, bn, base = layout.block_m, layout.block_n, mask.mask_mod

    def with_lists(b, h, q_idx, kv_idx):
        return base(b, h, q_idx, kv_idx) & listed[h, q_idx // bm, kv_idx // bn]

    eager = flex.BlockMask.from_kv_blocks(mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks,
                                          mask.full_kv_indices, BLOCK_SIZE=(bm, bn), mask_mod=with_lists,
                                          seq_lengths=mask.seq_lengths, compute_q_blocks=False)
    out = flex.flex_attention(layout.queries(q)[None], layout.keys(k)[None], layout.keys(v)[None], block_mask=eager,
                              scale=0.2, enable_gqa=True)
    got = layout.rows(out[0])
    ref = block_sparse_attention(q, k, v, lists, 0.2)
    assert got.shape == ref.shape and torch.isfinite(got).all()
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_the_padded_layout_maps_every_row_and_key_once():
    lists = _cases()[2]
    table = lists.table
    layout = FlexLayout.of(table)
    assert len(layout.q_pos) == table.n_query_blocks * table.block_m
    assert len(layout.kv_pos) == table.n_kv_blocks * table.block_n
    assert torch.equal(layout.q_pos[layout.q_dest].long(), torch.arange(table.seq_len))
    real_keys = layout.kv_pos[layout.kv_pos >= 0]
    real_keys = real_keys[real_keys < table.seq_len]
    assert torch.equal(real_keys.long(), torch.arange(table.seq_len))


def test_only_whole_causal_blocks_skip_the_mask():
    table = _cases()[2].table
    full = whole_causal_blocks(table)
    causal = table.causal_cells()
    sizes = table.q_len.long()[:, None] * table.kv_len.long()[None, :]
    whole = (table.q_len == table.block_m)[:, None] & (table.kv_len == table.block_n)[None, :]
    assert torch.equal(full, whole & (causal == sizes))
    assert full.any() and not full.all()
