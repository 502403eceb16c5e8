"""The attention kernel's work order (sift_cli.cuda.work_order): longest first, split rows, and the regrouping
by KV heads for the L2 cache. CPU tensors: the functions are plain torch; the GPU tests compare the CUDA
decoder's order with these entry for entry."""

import pytest
import torch

from sift_cli.cuda.work_order import grouped_for_l2, l2_group, work_order


def test_work_order_splits_long_rows_only():
    """Split-KV: rows longer than a fair share per CTA are cut into parts (none empty, longest first)."""
    offsets = torch.tensor([[[0, 2, 4, 6, 106]]], dtype=torch.int32)  # one head, rows of 2, 2, 2 and 100 blocks
    w = work_order(offsets, per_step=1, ctas=4, split_max=8, min_blocks=16)
    cap = int(w["cap"][0, 0])
    assert cap == max(16, -(-106 // 4))
    order = w["tile_order"][0].tolist()[: int(w["n_active"][0, 0])]
    rows = [v // 8 for v in order]
    assert rows.count(3) == 4 and all(rows.count(r) == 1 for r in (0, 1, 2))  # only the long row is split
    assert rows[:4] == [3, 3, 3, 3]  # longest parts first
    assert w["slot_base"][0].tolist() == [0, 0, 0, 0]  # one split row: its parts take slots 0..3


def test_work_order_ties_are_part_major():
    """Equal lengths keep the order the CUDA decoder's counting sort gives them: first parts of every row, then
    second parts, rows in order (decode.cu computes the same order; the GPU tests compare them entry for entry)."""
    offsets = torch.tensor([[[0, 40, 80, 81]]], dtype=torch.int32)  # rows of 40, 40 and 1 blocks
    w = work_order(offsets, per_step=1, ctas=8, split_max=8, min_blocks=16)
    order = w["tile_order"][0].tolist()[: int(w["n_active"][0, 0])]
    assert order == [0 * 8 + 0, 1 * 8 + 0, 0 * 8 + 1, 1 * 8 + 1, 0 * 8 + 2, 1 * 8 + 2, 2 * 8 + 0]  # 14s, 12s, 1
    assert w["slot_base"][0].tolist() == [0, 3, 6]


MB = 1 << 20


@pytest.mark.parametrize("seq_len,head_dim,kv_heads,expected", [
    (16384, 128, 8, 8),  # 64 MB: all heads fit (with the slack)
    (32768, 128, 8, 4),
    (49152, 128, 8, 2),
    (65536, 128, 8, 2),
    (131072, 128, 8, 1),
    (1 << 20, 128, 8, 1),  # never fewer than one
    (65536, 64, 3, 3),  # SmolLM2's shape fits whole at 64K
    (131072, 64, 3, 2),
    (262144, 64, 3, 1),
    (4096, 128, 1, 1),
])
def test_l2_group_fits_the_cache(seq_len, head_dim, kv_heads, expected):
    assert l2_group(seq_len, head_dim, kv_heads, 60 * MB) == expected


def _random_work(n_heads, M, seed, split_max=8, ctas=3):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 60, (2, n_heads, M), generator=g)  # two layers, some empty rows
    offsets = torch.cat([torch.zeros(2, n_heads, 1, dtype=torch.long), counts.cumsum(-1)], -1).int()
    return work_order(offsets, per_step=1, ctas=ctas, split_max=split_max, min_blocks=16)


@pytest.mark.parametrize("n_heads,kv_heads,per_group,M", [(8, 4, 1, 5), (8, 4, 2, 7), (6, 3, 2, 1), (4, 4, 1, 9)])
def test_grouped_for_l2_keeps_each_group_longest_first(n_heads, kv_heads, per_group, M):
    """Active tiles come group by group (KV heads [0, per_group) first), each group in the longest-first order it
    had; the inactive tail and every other field are untouched."""
    split_max = 8
    work = _random_work(n_heads, M, seed=M)
    group = n_heads // kv_heads
    out = grouped_for_l2(work, n_heads, M, per_group, group, split_max)
    for z in range(2):
        n = int(work["n_active"][z, 0])
        before, after = work["tile_order"][z].tolist(), out["tile_order"][z].tolist()
        assert after[n:] == before[n:]
        assert sorted(after[:n]) == sorted(before[:n])

        def kv_group(v):
            return v // split_max // M // group // per_group

        keys = [kv_group(v) for v in after[:n]]
        assert keys == sorted(keys)
        for k in set(keys):
            assert [v for v in after[:n] if kv_group(v) == k] == [v for v in before[:n] if kv_group(v) == k]
    for name in ("n_active", "cap", "slot_base"):
        assert out[name] is work[name]


def test_grouped_for_l2_with_every_head_is_the_same_order():
    work = _random_work(8, 6, seed=1)
    assert grouped_for_l2(work, 8, 6, 4, 2)["tile_order"] is work["tile_order"]
