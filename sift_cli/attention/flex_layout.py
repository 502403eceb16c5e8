"""FlexAttention on SIFT's own document-aligned blocks: the prompt's rows and keys laid out so that each block of
the block table (block_table.py) is exactly one of Flex's uniform blocks.

Our blocks start at each segment's first token, Flex's on a global grid, so a global grid cuts our blocks and
turns most listed blocks into partial ones. Here every query block is padded to `block_m` rows and every KV block
to `block_n` keys (`FlexLayout`: the gathers in and out, and each padded slot's position in the prompt, -1 / past
the end for padding). Then Flex's block lists are our CSR lists as they are: a listed block is "full" (no mask_mod
evaluated) when it is whole (no padding) and every pair in it is causal, "partial" otherwise, and the mask_mod is
causality over two token → position lookups, which also hides the padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import BlockLists
from .features import window_blocks

PAST_END = 2 ** 31 - 1  # position of a padded key: no query reaches it


@dataclass(frozen=True)
class FlexLayout:
    """The padded layout of one block table: `q_src` [M·block_m] the row each padded query slot reads (0 for
    padding), `q_dest` [L] the padded slot of each row, `kv_src` [N·block_n] the key each padded key slot reads,
    `q_pos` / `kv_pos` (int32) each slot's position in the prompt (-1 / PAST_END for padding)."""

    q_src: torch.Tensor
    q_dest: torch.Tensor
    kv_src: torch.Tensor
    q_pos: torch.Tensor
    kv_pos: torch.Tensor
    block_m: int
    block_n: int

    @staticmethod
    def of(table) -> "FlexLayout":
        dev = table.q_start.device
        bm, bn = table.block_m, table.block_n
        r = torch.arange(bm, device=dev)
        q_ok = r[None, :] < table.q_len.long()[:, None]
        q_pos = torch.where(q_ok, table.q_start.long()[:, None] + r[None, :], -1).reshape(-1)
        c = torch.arange(bn, device=dev)
        kv_ok = c[None, :] < table.kv_len.long()[:, None]
        kv_pos = table.kv_start.long()[:, None] + c[None, :]
        rows = torch.arange(table.seq_len, device=dev)
        block = torch.searchsorted(table.q_start.long(), rows, right=True) - 1  # no host sync (graph capture)
        q_dest = block * bm + rows - table.q_start.long()[block]
        return FlexLayout(q_src=q_pos.clamp(min=0), q_dest=q_dest,
                          kv_src=torch.where(kv_ok, kv_pos, 0).reshape(-1), q_pos=q_pos.to(torch.int32),
                          kv_pos=torch.where(kv_ok, kv_pos, PAST_END).reshape(-1).to(torch.int32),
                          block_m=bm, block_n=bn)

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        """[H, L, D] → [H, M·block_m, D]."""
        return q.index_select(1, self.q_src)

    def keys(self, k: torch.Tensor) -> torch.Tensor:
        """[H_kv, L, D] → [H_kv, N·block_n, D] (keys or values)."""
        return k.index_select(1, self.kv_src)

    def rows(self, out: torch.Tensor) -> torch.Tensor:
        """The prompt's rows of a padded output [H, M·block_m, ...] → [H, L, ...]."""
        return out.index_select(1, self.q_dest)


def whole_causal_blocks(table) -> torch.Tensor:
    """bool [M, N]: blocks with no padding whose every pair is causal (Flex computes them without a mask_mod)."""
    whole = (table.q_len == table.block_m)[:, None] & (table.kv_len == table.block_n)[None, :]
    return whole & (table.q_start[:, None] >= table.kv_start[None, :] + table.kv_len[None, :] - 1)


def _lists(m: torch.Tensor):
    """Flex's (counts [1, H, M], indices [1, H, M, N]) of a bool [H, M, N] block mask, listed blocks first."""
    counts = m.sum(-1, dtype=torch.int32)
    order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None].contiguous(), order[None].contiguous()


def block_mask_on_table(blocks: BlockLists, layout: FlexLayout | None = None, window: int | None = None):
    """(BlockMask over the padded layout computing exactly the listed blocks' causal pairs, the layout). A sliding
    `window` drops the blocks it hides and joins the mask_mod (every listed block is partial then)."""
    from torch.nn.attention.flex_attention import BlockMask

    table = blocks.table.to(blocks.offsets.device)
    layout = layout or FlexLayout.of(table)
    listed = blocks.dense_mask().to(table.q_start.device)  # [H, M, N]
    if window is not None:
        listed = listed & window_blocks(table.q_start, table.q_len, table.kv_start, table.kv_len, window)[None]
    full = listed & whole_causal_blocks(table)[None] & (window is None)
    kv_num, kv_idx = _lists(listed & ~full)
    full_num, full_idx = _lists(full)
    q_pos, kv_pos = layout.q_pos, layout.kv_pos

    def mask_mod(b, h, q_idx, kv_idx):
        return q_pos[q_idx] >= kv_pos[kv_idx]

    if window is not None:
        def mask_mod(b, h, q_idx, kv_idx):  # noqa: F811 - the windowed form
            return (q_pos[q_idx] >= kv_pos[kv_idx]) & (q_pos[q_idx] - kv_pos[kv_idx] < window)

    # compute_q_blocks builds the transposed lists only the backward pass reads: skip it (forward only)
    mask = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(layout.block_m, layout.block_n),
                                    mask_mod=mask_mod, seq_lengths=(len(q_pos), len(kv_pos)), compute_q_blocks=False)
    return mask, layout
