"""Bit vectors + block table → per-layer CSR block lists (SPEC §6–§7 v2), in vectorised PyTorch.

Blocks follow the prompt's segments (block_table.py). Block (qb, kb) is computed iff some allowed (query, key)
pair with key <= query lies in it. The allowed pairs are a union of rectangles (prefix rows × their causal keys,
doc rows × prefix keys, doc rows × CA-selected pages of earlier docs, LA-selected tiles inside a doc, suffix rows
× everything), so the rule is evaluated exactly on intervals: a rectangle reaches a block iff the two intersect
and the largest row of the intersection is >= its smallest column. Each row's list comes out in canonical order
(the blocks that need a mask first, then the rest, each group descending). Runs on whatever device the bits are
on; the CUDA decoder (cuda/decode.py) produces identical lists. Also here: the reports' measures, cell density and
`cells_over_allowed` (SPEC §6: causal pairs computed over pairs the token rule allows).

A dense document (no bits: not profiled yet) is dense in both directions: its rows see every earlier key, like
the suffix's, and the rows of every later document see all of its keys.
"""

from __future__ import annotations

import torch

from .attention.base import BlockLists
from .bits import n_pages, n_tiles
from .block_table import BlockTable
from .layout import PromptBits


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _unpack_bits(data: torch.Tensor, nbits: int) -> torch.Tensor:
    """uint8 [..., B] → bool [..., nbits], MSB first."""
    shifts = torch.arange(7, -1, -1, device=data.device, dtype=torch.uint8)
    bits = (data.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*data.shape[:-1], -1)[..., :nbits].bool()


def _la_tiles(bits: PromptBits, d: int, layers: range) -> torch.Tensor:
    """bool [Y, H, P, P] LA tiles of doc d at consecutive layers (upper triangle False; every tile of a dense
    document)."""
    H, Y = bits.n_heads, len(layers)
    p = n_pages(int(bits.doc_len[d]), bits.tile)
    if int(bits.doc_dense[d]):
        return torch.ones(p, p, dtype=torch.bool, device=bits.la.device).tril().expand(Y, H, p, p).clone()
    lb = int(bits.la_len[d])
    start = int(bits.la_base[d]) + layers.start * H * lb  # a doc's vectors are stored layer by layer, head by head
    flat = _unpack_bits(bits.la[start: start + Y * H * lb].view(Y, H, lb), n_tiles(p))
    rows, cols = torch.tril_indices(p, p, device=flat.device)
    tiles = torch.zeros(Y, H, p, p, dtype=torch.bool, device=flat.device)
    tiles[:, :, rows, cols] = flat
    return tiles


def _ca_pages(bits: PromptBits, d: int, layers: range) -> torch.Tensor:
    """bool [Y, H, P] CA pages of doc d at consecutive layers (every page of a dense document)."""
    H, Y = bits.n_heads, len(layers)
    p = n_pages(int(bits.doc_len[d]), bits.tile)
    if int(bits.doc_dense[d]):
        return torch.ones(Y, H, p, dtype=torch.bool, device=bits.la.device)
    cb = int(bits.ca_len[d])
    start = int(bits.ca_base[d]) + layers.start * H * cb
    return _unpack_bits(bits.ca[start: start + Y * H * cb].view(Y, H, cb), p)


def doc_la_tiles(bits: PromptBits, d: int, layer: int) -> torch.Tensor:
    """bool [H, P, P] LA tiles of doc d at one layer (upper triangle False; every tile of a dense document)."""
    return _la_tiles(bits, d, range(layer, layer + 1))[0]


def doc_ca_pages(bits: PromptBits, d: int, layer: int) -> torch.Tensor:
    """bool [H, P] CA pages of doc d at one layer (every page of a dense document)."""
    return _ca_pages(bits, d, range(layer, layer + 1))[0]


def _pieces(start: int, length: int, tile: int, block_starts: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split [start, start + length) at tile boundaries (from `start`) and at the blocks' first tokens.

    Returns (tile index, block index, first token, last token) of each piece, global token coordinates."""
    device = block_starts.device
    cuts = torch.arange(start, start + length, tile, device=device)
    inside = block_starts[(block_starts > start) & (block_starts < start + length)].long()
    firsts = torch.unique(torch.cat([cuts, inside]))  # sorted
    lasts = torch.cat([firsts[1:] - 1, torch.tensor([start + length - 1], device=device)])
    blocks = torch.searchsorted(block_starts.long(), firsts, right=True) - 1
    return (firsts - start) // tile, blocks, firsts, lasts


def block_mask_for_layer(bits: PromptBits, layer: int, table: BlockTable) -> torch.Tensor:
    """bool [H, M, N]: which blocks of `table` layer `layer` computes for every head."""
    return block_masks(bits, range(layer, layer + 1), table)[0]


def block_masks(bits: PromptBits, layers: range, table: BlockTable) -> torch.Tensor:
    """bool [Y, H, M, N]: which blocks of `table` each of the consecutive `layers` computes for every head. The
    geometry (dense rows, the prefix, which pieces of a document fall in which blocks) is worked out once for all
    of them; only the bits differ by layer."""
    lay = bits.layout
    device = bits.la.device
    table = table.to(device)
    H, T, Y = bits.n_heads, bits.tile, len(layers)
    M, N = table.n_query_blocks, table.n_kv_blocks
    q_first = table.q_start.long()
    q_last = q_first + table.q_len.long() - 1
    k_first = table.kv_start.long()
    k_doc = table.kv_doc.long()
    dense_docs = bits.dense_docs()

    # Dense rows (prefix, suffix, dense documents): keys up to the block's last dense row.
    dense_last = torch.full((M,), -1, dtype=torch.int64, device=device)
    if lay.prefix_len:
        in_prefix = q_first < lay.prefix_len
        dense_last = torch.where(in_prefix, torch.clamp(q_last, max=lay.prefix_len - 1), dense_last)
    for d in dense_docs:
        span = lay.docs[d]
        holds = (q_first < span.end) & (q_last >= span.start)
        dense_last = torch.where(holds, torch.maximum(dense_last, torch.clamp(q_last, max=span.end - 1)),
                                 dense_last)
    if lay.suffix_len:
        dense_last = torch.where(q_last >= lay.docs_end, q_last, dense_last)
    every_layer = k_first[None, :] <= dense_last[:, None]  # [M, N]
    if lay.docs:
        # Doc rows see the whole prefix (keys all precede the rows: causality holds).
        has_doc_rows = (q_last >= lay.prefix_len) & (q_first < lay.docs_end)
        every_layer |= has_doc_rows[:, None] & (k_doc[None, :] == -1)
    mask = every_layer.expand(Y, H, M, N).clone()
    if not lay.docs:
        return mask

    # CA: rows of doc d see the selected pages of docs m < d; a KV block lies in one document, so it is reached
    # from a query block iff its document precedes the block's last document and one of its pages is selected.
    doc_starts = torch.tensor([d.start for d in lay.docs], dtype=torch.int64, device=device)
    last_doc = torch.searchsorted(doc_starts, torch.clamp(q_last, max=lay.docs_end - 1), right=True) - 1
    last_doc = torch.where(has_doc_rows, last_doc, torch.full_like(last_doc, -1))
    ca_block = torch.zeros(Y, H, N, dtype=torch.int32, device=device)
    for d, span in enumerate(lay.docs):
        page, kb, _, _ = _pieces(span.start, span.n_tokens, T, table.kv_start)
        ca_block.index_add_(2, kb, _ca_pages(bits, d, layers)[:, :, page].int())
    reach = (k_doc[None, :] >= 0) & (k_doc[None, :] < last_doc[:, None])  # [M, N]
    mask |= (ca_block > 0)[:, :, None, :] & reach

    # LA: selected tiles inside each doc, exact on the diagonal band (a dense doc's rows are dense rows).
    for d, span in enumerate(lay.docs):
        if d in dense_docs:
            continue
        tiles = _la_tiles(bits, d, layers)  # [Y, H, P, P]
        r_tile, r_block, _, r_last = _pieces(span.start, span.n_tokens, T, table.q_start)
        c_tile, c_block, c_first, _ = _pieces(span.start, span.n_tokens, T, table.kv_start)
        visible = r_last[:, None] >= c_first[None, :]  # [R, C]
        pairs = tiles[:, :, r_tile][:, :, :, c_tile] & visible  # [Y, H, R, C]
        rows_to_qb = torch.zeros(M, r_tile.numel(), device=device)
        rows_to_qb[r_block, torch.arange(r_tile.numel(), device=device)] = 1.0
        cols_to_kb = torch.zeros(c_tile.numel(), N, device=device)
        cols_to_kb[torch.arange(c_tile.numel(), device=device), c_block] = 1.0
        mask |= (rows_to_qb @ pairs.float() @ cols_to_kb) > 0
    return mask


def block_lists_from_mask(mask: torch.Tensor, table: BlockTable) -> BlockLists:
    """bool [H, M, N] → CSR lists in canonical order: per row the blocks that need a mask (table.needs_mask) first,
    then the others, each group in descending block order."""
    H, M, N = mask.shape
    table = table.to(mask.device)
    order_key = torch.arange(N, device=mask.device)[None, :] + N * table.needs_mask().long()  # [M, N]
    key = torch.where(mask, order_key[None].expand(H, M, N), torch.full_like(order_key[None], -1).expand(H, M, N))
    order = torch.argsort(key, dim=-1, descending=True, stable=True)
    listed = torch.gather(mask, -1, order)
    indices = order[listed].to(torch.int32)  # row-major: (h, m) ascending, each row in canonical order
    counts = mask.sum(-1).reshape(-1).to(torch.int64)
    ends = torch.cumsum(counts, 0)
    offsets = torch.empty(H, M + 1, dtype=torch.int32, device=mask.device)
    offsets[:, :M] = (ends - counts).view(H, M).to(torch.int32)
    offsets[:, M] = ends.view(H, M)[:, -1].to(torch.int32) if M else 0
    return BlockLists(offsets, indices.contiguous(), table, mask)


def decode_layer(bits: PromptBits, layer: int, table: BlockTable) -> BlockLists:
    """SPEC §7 CSR lists for one layer over `table`."""
    return block_lists_from_mask(block_mask_for_layer(bits, layer, table), table)


MASK_ELEMENTS = 1 << 26  # block-mask elements decoded at once: layers go in groups that stay under it (64 MB)


def decode_layers(bits: PromptBits, table: BlockTable, n_layers: int) -> list[BlockLists]:
    """`decode_layer` of layers 0 .. n_layers - 1, the masks of several layers at once."""
    per_layer = max(1, bits.n_heads * table.n_query_blocks * table.n_kv_blocks)
    group = max(1, MASK_ELEMENTS // per_layer)
    lists = []
    for first in range(0, n_layers, group):
        masks = block_masks(bits, range(first, min(n_layers, first + group)), table)
        lists += [block_lists_from_mask(m, table) for m in masks]
    return lists


def dense_block_lists(table: BlockTable, n_heads: int) -> BlockLists:
    """Every causal block of every head: what full recompute computes."""
    M, N = table.n_query_blocks, table.n_kv_blocks
    causal = torch.arange(N, device=table.device)[None, :] <= table.last_causal_kv_block()[:, None]
    return block_lists_from_mask(causal[None].expand(n_heads, M, N).contiguous(), table)


def computed_cells(blocks: BlockLists) -> int:
    """Causal (query, key) pairs inside the listed blocks, over all heads."""
    cells = blocks.table.causal_cells().to(blocks.offsets.device)
    return int((blocks.dense_mask().to(torch.int64) * cells[None]).sum())


def cell_density(blocks: BlockLists, computed: int | None = None) -> float:
    """Computed (query, key) cells over all causal cells, across heads (the STUDY's density); computed: the lists'
    `computed_cells` when already counted."""
    L = blocks.seq_len
    computed = computed_cells(blocks) if computed is None else computed
    return computed / max(1.0, blocks.n_heads * L * (L + 1) / 2)


def cells_of_documents(blocks: BlockLists, bits: PromptBits, docs: list[int]) -> int:
    """Computed causal cells, over all heads, in the blocks whose keys lie in one of the documents `docs` or whose
    query rows meet one of them (what dense documents cost; exact with segment-aligned query blocks)."""
    table = blocks.table
    if not docs:
        return 0
    lay = bits.layout
    device = blocks.offsets.device
    q_first = table.q_start.long().to(device)
    q_last = q_first + table.q_len.long().to(device) - 1
    rows = torch.zeros_like(q_first, dtype=torch.bool)
    for d in docs:
        rows |= (q_first < lay.docs[d].end) & (q_last >= lay.docs[d].start)
    keys = torch.isin(table.kv_doc.long().to(device), torch.tensor(docs, dtype=torch.int64, device=device))
    cells = table.causal_cells().to(device) * (rows[:, None] | keys[None, :])
    return int((blocks.dense_mask().to(torch.int64) * cells[None]).sum())


def mean_densities(block_lists: list[BlockLists], computed: list[int] | None = None) -> tuple[float, float]:
    """(cell density averaged over layers, computed over causal blocks of all layers) of a prompt's block lists;
    computed: each layer's `computed_cells` when already counted."""
    computed = computed or [None] * len(block_lists)
    cells = sum(cell_density(b, c) for b, c in zip(block_lists, computed)) / len(block_lists)
    blocks = sum(b.computed_blocks() for b in block_lists) / sum(b.causal_blocks() for b in block_lists)
    return cells, blocks


def allowed_cells(bits: PromptBits, layer: int) -> int:
    """(query, key) pairs the token rule of SPEC §6 allows at one layer, over all heads, counted from the bits;
    a dense document's rows are allowed every earlier key."""
    lay = bits.layout
    dense_docs = set(bits.dense_docs())
    H, T, P = bits.n_heads, bits.tile, lay.prefix_len
    total = H * P * (P + 1) // 2
    suffix_rows = torch.arange(lay.docs_end, lay.seq_len, dtype=torch.int64)
    total += H * int((suffix_rows + 1).sum())
    ca_tokens = torch.zeros(H, dtype=torch.int64, device=bits.la.device)  # selected CA keys of the docs so far
    for d, span in enumerate(lay.docs):
        n = span.n_tokens
        pages = n_pages(n, T)
        size = torch.full((pages,), T, dtype=torch.int64, device=ca_tokens.device)
        size[-1] = n - T * (pages - 1)
        cells = size[:, None] * size[None, :]
        cells.diagonal().copy_(size * (size + 1) // 2)
        if d in dense_docs:
            total += H * (span.start * n + n * (n + 1) // 2)
        else:
            total += int((doc_la_tiles(bits, d, layer).to(torch.int64) * torch.tril(cells)[None]).sum())
            total += H * n * P + n * int(ca_tokens.sum())
        ca_tokens += (doc_ca_pages(bits, d, layer).to(torch.int64) * size[None, :]).sum(-1)
    return total


def cells_over_allowed(bits: PromptBits, layers: list[BlockLists], computed: list[int] | None = None) -> float:
    """SPEC §6's fidelity measure over every layer: causal pairs computed over pairs the token rule allows;
    computed: each layer's `computed_cells` when already counted."""
    computed = sum(computed) if computed is not None else sum(computed_cells(b) for b in layers)
    allowed = sum(allowed_cells(bits, layer) for layer in range(len(layers)))
    return computed / max(1, allowed)
