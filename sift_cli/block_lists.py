"""Bit vectors + prompt layout → per-layer CSR block lists (SPEC §6, §7), in vectorised PyTorch.

Block (qb, kb) is computed iff some allowed (query, key) pair with key <= query lies in it. The allowed pairs are
a union of rectangles (prefix rows × their causal keys, doc rows × prefix keys, doc rows × CA-selected pages of
earlier docs, LA-selected tiles inside a doc, suffix rows × everything), so the rule is evaluated exactly on
intervals: a rectangle reaches a block iff the two intersect and the largest row of the intersection is >= its
smallest column. Runs on whatever device the bits are on; the CUDA decoder must produce identical lists.
"""

from __future__ import annotations

import torch

from .attention.base import BlockLists
from .bits import n_pages, n_tiles
from .layout import PromptBits


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _unpack_bits(data: torch.Tensor, nbits: int) -> torch.Tensor:
    """uint8 [..., B] → bool [..., nbits], MSB first."""
    shifts = torch.arange(7, -1, -1, device=data.device, dtype=torch.uint8)
    bits = (data.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*data.shape[:-1], -1)[..., :nbits].bool()


def doc_la_tiles(bits: PromptBits, d: int, layer: int) -> torch.Tensor:
    """bool [H, P, P] LA tiles of doc d at one layer (upper triangle False)."""
    H = bits.n_heads
    p = n_pages(int(bits.doc_len[d]), bits.tile)
    lb = int(bits.la_len[d])
    start = int(bits.la_base[d]) + layer * H * lb
    flat = _unpack_bits(bits.la[start: start + H * lb].view(H, lb), n_tiles(p))
    rows, cols = torch.tril_indices(p, p, device=flat.device)
    tiles = torch.zeros(H, p, p, dtype=torch.bool, device=flat.device)
    tiles[:, rows, cols] = flat
    return tiles


def doc_ca_pages(bits: PromptBits, d: int, layer: int) -> torch.Tensor:
    """bool [H, P] CA pages of doc d at one layer."""
    H = bits.n_heads
    p = n_pages(int(bits.doc_len[d]), bits.tile)
    cb = int(bits.ca_len[d])
    start = int(bits.ca_base[d]) + layer * H * cb
    return _unpack_bits(bits.ca[start: start + H * cb].view(H, cb), p)


def _pieces(start: int, length: int, tile: int, block: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
    """Split [start, start + length) at tile and block boundaries.

    Returns (tile index, block index, first token, last token) of each piece, global token coordinates.
    """
    cuts = set(range(start, start + length, tile)) | set(range(_ceil_div(start, block) * block, start + length, block))
    cuts.add(start)
    firsts = torch.tensor(sorted(cuts), dtype=torch.int64, device=device)
    lasts = torch.cat([firsts[1:] - 1, torch.tensor([start + length - 1], device=device)])
    return (firsts - start) // tile, firsts // block, firsts, lasts


def block_mask_for_layer(bits: PromptBits, layer: int, block_m: int = 128, block_n: int = 64) -> torch.Tensor:
    """bool [H, M, N]: which blocks layer `layer` computes for every head."""
    lay = bits.layout
    device = bits.la.device
    H, L, T = bits.n_heads, lay.seq_len, bits.tile
    M, N = _ceil_div(L, block_m), _ceil_div(L, block_n)
    q_first = torch.arange(M, device=device) * block_m
    q_last = torch.clamp(q_first + block_m, max=L) - 1
    k_first = torch.arange(N, device=device) * block_n
    mask = torch.zeros(H, M, N, dtype=torch.bool, device=device)

    # Dense rows (prefix and suffix): keys up to the block's last dense row.
    dense_last = torch.full((M,), -1, dtype=torch.int64, device=device)
    if lay.prefix_len:
        in_prefix = q_first < lay.prefix_len
        dense_last = torch.where(in_prefix, torch.clamp(q_last, max=lay.prefix_len - 1), dense_last)
    if lay.suffix_len:
        dense_last = torch.where(q_last >= lay.docs_end, q_last, dense_last)
    mask |= (k_first[None, :] <= dense_last[:, None])[None]

    if not lay.docs:
        return mask

    # Doc rows see the whole prefix (keys all precede the rows: causality holds).
    has_doc_rows = (q_last >= lay.prefix_len) & (q_first < lay.docs_end)
    if lay.prefix_len:
        mask |= (has_doc_rows[:, None] & (k_first[None, :] < lay.prefix_len))[None]

    # CA: rows of doc d see the selected pages of docs m < d. The set grows with d, so a query block needs
    # only the set of the last doc it touches.
    ca_blocks = torch.zeros(H, N, dtype=torch.bool, device=device)  # blocks of selected pages of docs so far
    ca_before = []
    last_doc_of_block = torch.full((M,), -1, dtype=torch.int64, device=device)
    for d, span in enumerate(lay.docs):
        ca_before.append(ca_blocks)
        last_doc_of_block[span.start // block_m: (span.end - 1) // block_m + 1] = d
        pages = doc_ca_pages(bits, d, layer)  # [H, P]
        page_idx, kb, _, _ = _pieces(span.start, span.n_tokens, T, block_n, device)
        hits = torch.zeros(H, N, dtype=torch.int32, device=device).index_add_(1, kb, pages[:, page_idx].int())
        ca_blocks = ca_blocks | (hits > 0)
    reach = torch.stack(ca_before, 1)[:, last_doc_of_block.clamp(min=0)]  # [H, M, N]
    reach &= (last_doc_of_block >= 0)[None, :, None]
    mask |= reach

    # LA: selected tiles inside each doc, exact on the diagonal band.
    for d, span in enumerate(lay.docs):
        tiles = doc_la_tiles(bits, d, layer)  # [H, P, P]
        r_tile, r_block, _, r_last = _pieces(span.start, span.n_tokens, T, block_m, device)
        c_tile, c_block, c_first, _ = _pieces(span.start, span.n_tokens, T, block_n, device)
        visible = r_last[:, None] >= c_first[None, :]  # [R, C]
        pairs = tiles[:, r_tile][:, :, c_tile] & visible[None]  # [H, R, C]
        rows_to_qb = torch.zeros(M, r_tile.numel(), device=device)
        rows_to_qb[r_block, torch.arange(r_tile.numel(), device=device)] = 1.0
        cols_to_kb = torch.zeros(c_tile.numel(), N, device=device)
        cols_to_kb[torch.arange(c_tile.numel(), device=device), c_block] = 1.0
        mask |= (rows_to_qb @ pairs.float() @ cols_to_kb) > 0
    return mask


def block_lists_from_mask(mask: torch.Tensor, block_m: int, block_n: int, seq_len: int) -> BlockLists:
    """bool [H, M, N] → CSR with each row's KV blocks in descending order."""
    H, M, N = mask.shape
    counts = mask.sum(-1).reshape(-1).to(torch.int64)
    ends = torch.cumsum(counts, 0)
    offsets = torch.empty(H, M + 1, dtype=torch.int32, device=mask.device)
    offsets[:, :M] = (ends - counts).view(H, M).to(torch.int32)
    offsets[:, M] = ends.view(H, M)[:, -1].to(torch.int32)
    flipped = torch.nonzero(mask.flip(-1))  # row-major: (h, m) ascending, flipped column ascending
    indices = (N - 1 - flipped[:, 2]).to(torch.int32)
    return BlockLists(offsets, indices.contiguous(), block_m, block_n, seq_len, mask)


def decode_layer(bits: PromptBits, layer: int, block_m: int = 128, block_n: int = 64) -> BlockLists:
    """SPEC §7 CSR lists for one layer."""
    return block_lists_from_mask(block_mask_for_layer(bits, layer, block_m, block_n), block_m, block_n,
                            bits.layout.seq_len)


def dense_block_lists(seq_len: int, n_heads: int, block_m: int = 128, block_n: int = 64, device=None) -> BlockLists:
    """Every causal block: what full recompute computes."""
    M, N = _ceil_div(seq_len, block_m), _ceil_div(seq_len, block_n)
    q_last = torch.clamp(torch.arange(M, device=device) * block_m + block_m, max=seq_len) - 1
    k_first = torch.arange(N, device=device) * block_n
    mask = (k_first[None, :] <= q_last[:, None]).expand(n_heads, M, N)
    return block_lists_from_mask(mask.contiguous(), block_m, block_n, seq_len)


def causal_cells_per_block(seq_len: int, block_m: int, block_n: int, device=None) -> torch.Tensor:
    """int64 [M, N]: number of (i, j) pairs with j <= i inside each block."""
    M, N = _ceil_div(seq_len, block_m), _ceil_div(seq_len, block_n)
    a = (torch.arange(M, device=device) * block_m)[:, None]
    b = torch.clamp(a + block_m, max=seq_len) - 1
    c = (torch.arange(N, device=device) * block_n)[None, :]
    d = torch.clamp(c + block_n, max=seq_len) - 1
    lo, hi = torch.maximum(a, c), torch.minimum(b, d)  # rows seeing part of the block: i - c + 1 keys each
    n1 = torch.clamp(hi - lo + 1, min=0)
    part1 = n1 * (lo - c + 1) + n1 * (n1 - 1) // 2
    full_from = torch.maximum(a, d + 1)  # rows seeing the whole block width
    part2 = torch.clamp(b - full_from + 1, min=0) * (d - c + 1)
    return part1 + part2


def cell_density(blocks: BlockLists) -> float:
    """Computed (query, key) cells over all causal cells, across heads (the STUDY's density)."""
    cells = causal_cells_per_block(blocks.seq_len, blocks.block_m, blocks.block_n, blocks.offsets.device)
    computed = (blocks.dense_mask().to(torch.int64) * cells[None]).sum()
    L = blocks.seq_len
    return float(computed) / (blocks.n_heads * L * (L + 1) / 2)


def mean_densities(block_lists: list[BlockLists]) -> tuple[float, float]:
    """(cell density averaged over layers, computed over causal blocks of all layers) of a prompt's block lists."""
    cells = sum(cell_density(b) for b in block_lists) / len(block_lists)
    blocks = sum(b.computed_blocks() for b in block_lists) / sum(b.causal_blocks() for b in block_lists)
    return cells, blocks
