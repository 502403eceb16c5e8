"""The one interface every attention backend implements.

A backend computes block-sparse causal attention for one layer of one prompt (batch 1):

    q  [H, L, D]      k, v  [H_kv, L, D]      (H is a multiple of H_kv: grouped-query attention)
    blocks.offsets    int32 [H, M + 1]        CSR row pointers into one shared `indices` array, M = ceil(L / block_m);
                                              row (h, m) is indices[offsets[h, m] : offsets[h, m + 1]] and
                                              offsets[h, M] == offsets[h + 1, 0] (offsets[0, 0] == 0)
    blocks.indices    int32 [nnz]             KV block ids of each (head, query block), descending
    → out [H, L, D] in q's dtype (and, when asked, the natural-log log-sum-exp [H, L] in fp32)

Inside a listed block every causally visible (query, key) pair is computed; blocks that are not listed
contribute nothing to the softmax (SPEC §6). A query row whose listed blocks hold no visible key cannot occur
(the diagonal block is always listed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class BlockLists:
    """CSR lists of the KV blocks each (head, query block) computes, for one layer."""

    offsets: torch.Tensor  # int32 [H, M + 1]
    indices: torch.Tensor  # int32 [nnz]
    block_m: int
    block_n: int
    seq_len: int
    mask: torch.Tensor | None = None  # optional bool [H, M, N] the lists came from (saves rebuilding it)

    @property
    def n_heads(self) -> int:
        return self.offsets.shape[0]

    @property
    def n_query_blocks(self) -> int:
        return self.offsets.shape[1] - 1

    @property
    def n_kv_blocks(self) -> int:
        return -(-self.seq_len // self.block_n)

    def to(self, device: torch.device | str) -> "BlockLists":
        return BlockLists(self.offsets.to(device), self.indices.to(device), self.block_m, self.block_n, self.seq_len,
                           None if self.mask is None else self.mask.to(device))

    def computed_blocks(self) -> int:
        return int(self.indices.numel())

    def causal_blocks(self) -> int:
        """Blocks a dense causal pass computes for every head: the denominator of block density."""
        return self.n_heads * causal_block_count(self.seq_len, self.block_m, self.block_n)

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
        flat[rows, self.indices.long()] = True
        return mask


def causal_block_count(seq_len: int, block_m: int, block_n: int) -> int:
    """Number of (query block, KV block) pairs that hold at least one causal (i >= j) pair."""
    m = -(-seq_len // block_m)
    total = 0
    for qb in range(m):
        last_row = min((qb + 1) * block_m, seq_len) - 1
        total += last_row // block_n + 1
    return total


class AttentionBackend(Protocol):
    name: str

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists, scale: float,
                return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ...
