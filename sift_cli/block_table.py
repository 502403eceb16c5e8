"""The block table of one prompt (SPEC §6–§7 v2): blocks follow the segments, not a global grid.

KV block kb covers keys [kv_start[kb], kv_start[kb] + kv_len[kb]) of one segment (prefix, a document or the
suffix): every segment is cut from its own first token into blocks of `block_n` keys, the last one partial. With
`block_n` equal to the profiling tile T a document's KV blocks are exactly its CA pages and LA tile columns.
Query block m covers rows [q_start[m], q_start[m] + q_len[m]): cut per segment the same way ("segment", the
default), or on the global grid of `block_m` rows ("grid"). One table serves every layer and head of the prompt;
the CSR block lists (block_lists.py) index into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .device_copy import DeviceTensors
from .layout import PromptLayout

QUERY_BLOCKS = ("segment", "grid")


def _cut(segments: list[tuple[int, int, int]], block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, length, segment id) of each segment -> (start, length, segment id) of its blocks."""
    if not segments:
        return (np.zeros(0, np.int32),) * 3
    start, length, owner = np.asarray(segments, dtype=np.int64).T
    per = (length + block - 1) // block  # blocks of each segment
    seg = np.repeat(np.arange(len(segments)), per)
    offset = (np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)) * block
    return tuple(a.astype(np.int32) for a in (start[seg] + offset, np.minimum(block, length[seg] - offset),
                                               owner[seg]))


@dataclass(frozen=True)
class BlockTable(DeviceTensors):
    """Query and KV block geometry of one prompt. Tensors are int32 and live on one device."""

    q_start: torch.Tensor  # [M]
    q_len: torch.Tensor  # [M]
    kv_start: torch.Tensor  # [N]
    kv_len: torch.Tensor  # [N]
    kv_doc: torch.Tensor  # [N]: the document of the block, -1 for the prefix, n_docs for the suffix
    block_m: int
    block_n: int
    seq_len: int
    query_blocks: str = "segment"
    n_causal_blocks: int = -1  # (query block, KV block) pairs holding a causal pair, per head (host-side)

    @staticmethod
    def for_layout(layout: PromptLayout, block_m: int = 128, block_n: int = 64, query_blocks: str = "segment",
                   device=None) -> "BlockTable":
        if query_blocks not in QUERY_BLOCKS:
            raise ValueError(f"query_blocks must be one of {QUERY_BLOCKS}, not {query_blocks!r}")
        n_docs = len(layout.docs)
        segments = [(0, layout.prefix_len, -1)] if layout.prefix_len else []
        segments += [(d.start, d.n_tokens, i) for i, d in enumerate(layout.docs)]
        if layout.suffix_len:
            segments.append((layout.docs_end, layout.suffix_len, n_docs))
        kv_start, kv_len, kv_doc = _cut(segments, block_n)
        if query_blocks == "segment":
            q_start, q_len, _ = (kv_start, kv_len, None) if block_m == block_n else _cut(segments, block_m)
        else:
            q_start = np.arange(0, layout.seq_len, block_m, dtype=np.int32)
            q_len = np.minimum(block_m, layout.seq_len - q_start).astype(np.int32)
        q_last = q_start.astype(np.int64) + q_len - 1
        causal = int((np.searchsorted(kv_start, q_last, side="right")).sum())  # known here, so no device read later
        arrays = [torch.as_tensor(a, dtype=torch.int32) for a in (q_start, q_len, kv_start, kv_len, kv_doc)]
        table = BlockTable(*arrays, block_m, block_n, layout.seq_len, query_blocks, causal)
        return table if device is None else table.to(device)

    @staticmethod
    def causal(seq_len: int, block_m: int = 128, block_n: int = 64, device=None) -> "BlockTable":
        """One segment of `seq_len` tokens (plain causal attention): the global grid."""
        return BlockTable.for_layout(PromptLayout(seq_len, (), 0), block_m, block_n, "segment", device)

    @property
    def n_query_blocks(self) -> int:
        return int(self.q_start.numel())

    @property
    def n_kv_blocks(self) -> int:
        return int(self.kv_start.numel())

    @property
    def device(self) -> torch.device:
        return self.q_start.device

    TENSORS = ("q_start", "q_len", "kv_start", "kv_len", "kv_doc")  # moved together by DeviceTensors.to

    def token_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 [L] query block of each row, int64 [L] KV block of each key."""
        rows = torch.repeat_interleave(torch.arange(self.n_query_blocks, device=self.device), self.q_len.long())
        keys = torch.repeat_interleave(torch.arange(self.n_kv_blocks, device=self.device), self.kv_len.long())
        return rows, keys

    def last_causal_kv_block(self) -> torch.Tensor:
        """int64 [M]: the last KV block whose first key a row of the query block can see."""
        q_last = (self.q_start + self.q_len - 1).long()
        return torch.searchsorted(self.kv_start.long(), q_last, right=True) - 1

    def causal_cells(self) -> torch.Tensor:
        """int64 [M, N]: causal (row >= key) pairs inside each block."""
        a = self.q_start.long()[:, None]
        b = a + self.q_len.long()[:, None] - 1
        c = self.kv_start.long()[None, :]
        d = c + self.kv_len.long()[None, :] - 1
        lo, hi = torch.maximum(a, c), torch.minimum(b, d)
        n1 = torch.clamp(hi - lo + 1, min=0)  # rows that see part of the block: row - c + 1 keys each
        part1 = n1 * (lo - c + 1) + n1 * (n1 - 1) // 2
        full_from = torch.maximum(a, d + 1)  # rows that see the whole block
        part2 = torch.clamp(b - full_from + 1, min=0) * (d - c + 1)
        return part1 + part2

    def needs_mask(self) -> torch.Tensor:
        """bool [M, N]: block kb needs the masked softmax in query block m (partial, or its last key lies past the
        block's first row). Lists put these blocks first (the CUDA kernel's contract)."""
        return ((self.kv_len < self.block_n)[None, :]
                | (self.kv_start[None, :] + self.block_n - 1 > self.q_start[:, None]))

    def causal_block_count(self) -> int:
        """(query block, KV block) pairs holding at least one causal pair, per head (no device read: a CUDA graph
        capture may call it)."""
        if self.n_causal_blocks >= 0:
            return self.n_causal_blocks
        return int((self.last_causal_kv_block() + 1).sum())
