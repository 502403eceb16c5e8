"""The attention kernel's key tiles (sift_cli.cuda.coalesce): each row's runs of consecutive KV blocks re-cut into
full tiles hold exactly the keys of the listed blocks, in fewer tiles, in the kernel's canonical order. CPU: the
PyTorch reference; the GPU tests compare coalesce.cu with it entry for entry."""

import numpy as np
import pytest
import torch

from sift_cli.block_lists import decode_layer
from sift_cli.block_table import BlockTable
from sift_cli.cuda.checks import awkward_layouts, random_block_lists, random_case_bits
from sift_cli.cuda.coalesce import CO_LIST, CO_WARPS, coalesce_reference, entry
from sift_cli.cuda.decode import SCAN_SMEM, check_work_blocks
from sift_cli.errors import SiftError
from sift_cli.layout import PromptLayout


def _keys(starts_lens) -> list[int]:
    return [k for s, n in starts_lens for k in range(s, s + n)]


def _check(blocks, table):
    offsets, indices = blocks.offsets[None], blocks.indices[None]
    t_off, t_ent = coalesce_reference(offsets, indices, table)
    B = table.block_n
    q0s, ks, kl = table.q_start.tolist(), table.kv_start.tolist(), table.kv_len.tolist()
    H, M1 = blocks.offsets.shape
    assert t_off[0, -1, -1] == len(t_ent[0])
    for h in range(H):
        for m in range(M1 - 1):
            row = blocks.indices[int(blocks.offsets[h, m]): int(blocks.offsets[h, m + 1])].tolist()
            tiles = [(e >> 8, e & 255) for e in t_ent[0][int(t_off[0, h, m]): int(t_off[0, h, m + 1])]]
            keys = _keys(tiles)
            assert sorted(keys) == sorted(_keys((ks[kb], kl[kb]) for kb in row))  # same keys, none twice
            assert len(tiles) <= len(row) and all(0 < n <= B for _, n in tiles)
            masked = [n < B or s + B - 1 > q0s[m] for s, n in tiles]
            n_mask = sum(masked)
            assert masked == [True] * n_mask + [False] * (len(tiles) - n_mask)  # masked tiles first
            for part in (tiles[:n_mask], tiles[n_mask:]):
                assert [s for s, _ in part] == sorted((s for s, _ in part), reverse=True)
    return t_off, t_ent


def test_a_run_of_short_documents_becomes_full_tiles():
    """Three 140-token documents after a 16-token prefix, every block listed for the last query block: 10 blocks
    (16 | 64 64 12 | 64 64 12 | 64 64 12) hold 436 keys, 7 tiles cut from the end (the first 52 keys partial)."""
    layout = PromptLayout.build(16, ["a", "b", "c"], [140, 140, 140], 0)
    table = BlockTable.for_layout(layout, 64, 64, "segment")
    M, N = table.n_query_blocks, table.n_kv_blocks
    assert N == 10
    last = torch.arange(N - 1, -1, -1, dtype=torch.int32)
    offsets = torch.zeros(1, 1, M + 1, dtype=torch.int32)
    offsets[0, 0, M] = N
    indices = last[None]  # only the last query block lists blocks (all of them, descending)
    _, ent = coalesce_reference(offsets, indices, table)
    e = 436
    expect = [(e - 64, 64)] + [(e - 64 * j, 64) for j in range(2, 7)] + [(0, e - 6 * 64)]
    q0 = int(table.q_start[M - 1])
    masked = [t for t in expect if t[1] < 64 or t[0] + 63 > q0]
    rest = [t for t in expect if t not in masked]
    assert ent[0] == [entry(s, n) for s, n in sorted(masked, reverse=True) + sorted(rest, reverse=True)]


@pytest.mark.parametrize("query_blocks", ["segment", "grid"])
@pytest.mark.parametrize("block_n", [64, 128])
def test_reference_keeps_the_keys_on_awkward_layouts(query_blocks, block_n):
    rng = np.random.default_rng(block_n)
    for prefix, docs, suffix in awkward_layouts():
        bits = random_case_bits(rng, 64, n_layers=1, n_heads=3, doc_lengths=docs, prefix_len=prefix,
                                suffix_len=suffix, la_p=0.3, ca_p=0.2)
        table = BlockTable.for_layout(bits.layout, 64, block_n, query_blocks)
        _check(decode_layer(bits, 0, table), table)


@pytest.mark.parametrize("L", [1, 63, 65, 129, 1000])
def test_dense_causal_rows_become_the_grid(L):
    """With every causal block listed on one segment, the tiles are ceil(row end / 64) per row: the grid's count."""
    table = BlockTable.causal(L, 64, 64)
    blocks = random_block_lists(table, 2, 1.0)
    t_off, _ = _check(blocks, table)
    counts = (t_off[0, :, 1:] - t_off[0, :, :-1])
    ends = table.q_start + table.q_len
    assert counts.tolist() == [[-(-int(e) // 64) for e in ends]] * 2


def test_without_merge_entries_are_the_blocks_in_list_order():
    rng = np.random.default_rng(5)
    bits = random_case_bits(rng, 64, n_layers=1, n_heads=2, doc_lengths=[300, 65, 1, 127], prefix_len=16,
                            suffix_len=20, la_p=0.3, ca_p=0.2)
    table = BlockTable.for_layout(bits.layout, 64, 64, "segment")
    blocks = decode_layer(bits, 0, table)
    t_off, ent = coalesce_reference(blocks.offsets[None], blocks.indices[None], table, merge=False)
    assert torch.equal(t_off[0], blocks.offsets)
    assert ent[0] == [entry(int(table.kv_start[kb]), int(table.kv_len[kb])) for kb in blocks.indices.tolist()]


def test_tiles_shared_memory_fits_at_the_work_orders_cap():
    """KernelLists asks check_work_blocks before its first launch; up to that cap a CTA's bitmaps and staged lists
    stay within the 48 KB of dynamic shared memory a launch gets without opting in."""
    cap = SCAN_SMEM // 4 - 1
    check_work_blocks(cap)
    assert 4 * (cap // 32 + 1 + CO_LIST) * CO_WARPS <= 48 * 1024
    with pytest.raises(SiftError, match="too many"):
        check_work_blocks(cap + 1)
