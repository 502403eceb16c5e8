"""The one interface every attention backend implements.

A backend computes block-sparse causal attention for one layer of one prompt (batch 1):

    q  [H, L, D]      k, v  [H_kv, L, D]      (H is a multiple of H_kv: grouped-query attention)
    blocks.table      the prompt's BlockTable (block_table.py): query block m covers rows [q_start[m], +q_len[m]),
                      KV block kb keys [kv_start[kb], +kv_len[kb]); blocks follow the segments (SPEC §6 v2)
    blocks.offsets    int32 [H, M + 1]        CSR row pointers into one shared `indices` array; row (h, m) is
                                              indices[offsets[h, m] : offsets[h, m + 1]] and offsets[h, M] ==
                                              offsets[h + 1, 0] (offsets[0, 0] == 0)
    blocks.indices    int32 [>= nnz]          KV block ids of each (head, query block), in canonical order: the
                                              blocks that need a mask (table.needs_mask) first, then the rest, each
                                              group descending (so the diagonal block comes first)
    → out [H, L, D] in q's dtype (and, when asked, the natural-log log-sum-exp [H, L] in fp32)

Inside a listed block every causally visible (query, key) pair whose key lies in the block is computed; blocks
that are not listed contribute nothing to the softmax (SPEC §6). Every row lists its diagonal block, so no row
is left without a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..block_table import BlockTable


@dataclass(frozen=True)
class BlockLists:
    """CSR lists of the KV blocks each (head, query block) computes, for one layer, over the prompt's block table.
    `indices` may be longer than the lists (an index array sized by a bound); offsets[-1, -1] is the count."""

    offsets: torch.Tensor  # int32 [H, M + 1]
    indices: torch.Tensor  # int32 [>= nnz]
    table: BlockTable
    mask: torch.Tensor | None = None  # optional bool [H, M, N] the lists came from (saves rebuilding it)

    @property
    def block_m(self) -> int:
        return self.table.block_m

    @property
    def block_n(self) -> int:
        return self.table.block_n

    @property
    def seq_len(self) -> int:
        return self.table.seq_len

    @property
    def n_heads(self) -> int:
        return self.offsets.shape[0]

    @property
    def n_query_blocks(self) -> int:
        return self.offsets.shape[1] - 1

    @property
    def n_kv_blocks(self) -> int:
        return self.table.n_kv_blocks

    def to(self, device: torch.device | str) -> "BlockLists":
        return BlockLists(self.offsets.to(device), self.indices.to(device), self.table.to(device),
                          None if self.mask is None else self.mask.to(device))

    def computed_blocks(self) -> int:
        """Listed (head, query block, KV block) triples (reads the count from the device)."""
        return int(self.offsets[-1, -1]) if self.offsets.numel() else 0

    def causal_blocks(self) -> int:
        """Blocks a dense causal pass computes for every head: the denominator of block density."""
        return self.n_heads * self.table.causal_block_count()

    def density(self) -> float:
        return self.computed_blocks() / max(1, self.causal_blocks())

    def dense_mask(self) -> torch.Tensor:
        """Boolean [H, M, N] mask of the listed blocks."""
        if self.mask is not None:
            return self.mask
        h, m1 = self.offsets.shape
        mask = torch.zeros(h, m1 - 1, self.n_kv_blocks, dtype=torch.bool, device=self.offsets.device)
        offsets = self.offsets.long()
        counts = (offsets[:, 1:] - offsets[:, :-1]).reshape(-1)
        rows = torch.repeat_interleave(torch.arange(h * (m1 - 1), device=mask.device), counts)
        flat = mask.view(h * (m1 - 1), -1)
        flat[rows, self.indices[: rows.numel()].long()] = True
        return mask


class AttentionBackend(Protocol):
    name: str

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists, scale: float,
                return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ...
