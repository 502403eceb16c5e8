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
from ...layout import PromptLayout


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sink_window_mask(lay: PromptLayout, window: int, block_m: int, block_n: int, device=None) -> torch.Tensor:
    """bool [M, N]: dense prefix/suffix rows; document rows see the sink blocks and `window` blocks up to the
    diagonal."""
    L = lay.seq_len
    M, N = _ceil_div(L, block_m), _ceil_div(L, block_n)
    q_first = torch.arange(M, device=device) * block_m
    q_last = torch.clamp(q_first + block_m, max=L) - 1
    kb = torch.arange(N, device=device)
    k_first = kb * block_n
    causal = k_first[None, :] <= q_last[:, None]
    dense_row = (q_first < lay.prefix_len) | (q_last >= lay.docs_end)
    diag = q_last // block_n  # the last KV block a row block reaches
    in_window = kb[None, :] > (diag[:, None] - window)
    sink = k_first < max(lay.prefix_len, 1)
    mask = causal & (dense_row[:, None] | in_window | sink[None, :])
    return mask


def matched_sink_window(lay: PromptLayout, target_density: float, n_heads: int, block_m: int = 128,
                        block_n: int = 64, device=None) -> tuple[BlockLists, int]:
    """(block lists, window) of the smallest window whose block density is >= target_density."""
    N = _ceil_div(lay.seq_len, block_n)
    causal_total = int(sink_window_mask(lay, N + 1, block_m, block_n, device).sum())

    def density(w: int) -> float:
        return int(sink_window_mask(lay, w, block_m, block_n, device).sum()) / causal_total

    lo, hi = 1, N + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if density(mid) >= target_density - 1e-12:
            hi = mid
        else:
            lo = mid + 1
    mask = sink_window_mask(lay, lo, block_m, block_n, device)
    return block_lists_from_mask(mask[None].expand(n_heads, -1, -1).contiguous(), block_m, block_n, lay.seq_len), lo


def matched_block_lists(lay: PromptLayout, sift_lists: list[BlockLists]) -> tuple[list[BlockLists], list[int]]:
    """Per layer, sink+window at the block density of SIFT's block lists for that layer."""
    out, windows = [], []
    for s in sift_lists:
        blocks, w = matched_sink_window(lay, s.density(), s.n_heads, s.block_m, s.block_n, s.offsets.device)
        out.append(blocks)
        windows.append(w)
    return out, windows
