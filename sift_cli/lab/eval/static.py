"""The static sparse baseline: attention sinks + a sliding window (StreamingLLM-style), at SIFT's block density.

It knows the prompt's layout as SIFT does, so prefix and suffix rows stay dense; a document row block computes
the sink blocks (every KV block holding prefix tokens, at least the first one) and the `w` KV blocks ending at
its diagonal. For each layer, `w` is the smallest window whose block density (over all heads, the same pattern
for every head) is at least the density SIFT computes at that layer — so both spend the same attention budget,
and only *which* blocks differ.
"""

from __future__ import annotations

import torch

from ...attention.base import BlockLists
from ...block_lists import block_lists_from_mask
from ...block_table import BlockTable
from ...layout import PromptLayout


def sink_window_mask(lay: PromptLayout, table: BlockTable, window: int) -> torch.Tensor:
    """bool [M, N] over the prompt's block table: dense prefix/suffix rows; document rows see the sink blocks and
    `window` blocks up to the diagonal."""
    q_first = table.q_start.long()
    q_last = q_first + table.q_len.long() - 1
    kb = torch.arange(table.n_kv_blocks, device=table.device)
    diag = table.last_causal_kv_block()  # the last KV block a row block reaches
    causal = kb[None, :] <= diag[:, None]
    dense_row = (q_first < lay.prefix_len) | (q_last >= lay.docs_end)
    in_window = kb[None, :] > (diag[:, None] - window)
    sink = (table.kv_start < max(lay.prefix_len, 1))
    return causal & (dense_row[:, None] | in_window | sink[None, :])


def matched_sink_window(lay: PromptLayout, table: BlockTable, target_density: float, n_heads: int
                        ) -> tuple[BlockLists, int]:
    """(block lists, window) of the smallest window whose block density is >= target_density."""
    N = table.n_kv_blocks
    causal_total = int(sink_window_mask(lay, table, N + 1).sum())

    def density(w: int) -> float:
        return int(sink_window_mask(lay, table, w).sum()) / causal_total

    lo, hi = 1, N + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if density(mid) >= target_density - 1e-12:
            hi = mid
        else:
            lo = mid + 1
    mask = sink_window_mask(lay, table, lo)
    return block_lists_from_mask(mask[None].expand(n_heads, -1, -1).contiguous(), table), lo


def matched_block_lists(lay: PromptLayout, sift_lists: list[BlockLists]) -> tuple[list[BlockLists], list[int]]:
    """Per layer, sink+window at the block density of SIFT's block lists for that layer (same block table)."""
    out, windows = [], []
    for s in sift_lists:
        blocks, w = matched_sink_window(lay, s.table.to(s.offsets.device), s.density(), s.n_heads)
        out.append(blocks)
        windows.append(w)
    return out, windows
