"""The CUDA bit-vector decoder of kernels/decode.cu: every layer's CSR block lists of one prompt, over its block
table, with no host synchronisation (identical to block_lists.decode_layer, order included).

Three launches cover all layers: count (one CTA per query block and 8 heads, grid z = layer), prefix sum, write.
The index arrays are sized by the causal bound (every causal block of every head), known from the table alone,
so nothing waits for the counts; `CudaDecoder.layer(l)` is a BlockLists view of layer l. The prefix-sum launch
(`scan_counts`) also serves the attention kernel's tiles (`cuda.coalesce.KernelLists`): given a `WorkSpec`, it
computes their work order alongside (equal to `cuda.work_order.work_order`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..attention.base import BlockLists
from ..block_table import BlockTable
from ..errors import SiftError
from .runtime import check_device, compiled_module, function_ptr, launch


@dataclass(frozen=True)
class WorkSpec:
    """How the attention kernel's lists and work order are made from the block lists (`cuda.coalesce.KernelLists`,
    `cuda.work_order.work_order`)."""

    per_step: int  # table blocks per pipeline step (2 when 64-key blocks are paired)
    ctas: int  # persistent CTAs of the attention launch
    split_max: int
    min_blocks: int
    merge: bool = True  # runs of consecutive blocks computed as full tiles (False: a tile per block)


DEC_THREADS = 128
DEC_HEADS = 8  # heads per CTA (decode.cu)
SCAN_THREADS = 1024
SCAN_SMEM = 200 * 1024  # the work order's length histogram: 4 bytes per KV block of the prompt
_BITS = (("la", torch.uint8), ("ca", torch.uint8), ("doc_start", torch.int32), ("doc_len", torch.int32),
         ("la_base", torch.int64), ("la_len", torch.int32), ("ca_base", torch.int64), ("ca_len", torch.int32),
         ("doc_dense", torch.int32))


_FUNCTIONS: dict[int, dict[str, int]] = {}


def _functions(device_index: int) -> dict[str, int]:
    fns = _FUNCTIONS.get(device_index)
    if fns is None:
        mod = compiled_module("decode.cu", (), device_index)
        fns = _FUNCTIONS[device_index] = {n: function_ptr(mod, f"sift_decode_{n}", SCAN_SMEM if n == "scan" else 0)
                                          for n in ("count", "scan", "write")}
    return fns


def check_work_blocks(n_kv_blocks: int) -> None:
    """The work order's histogram (sift_decode_scan's shared memory) holds a part of any length up to N."""
    if 4 * (n_kv_blocks + 1) > SCAN_SMEM:
        raise SiftError(f"the prompt's {n_kv_blocks} KV blocks are too many for the work order's histogram; use "
                        "KV blocks of 128 (--block-n 128)")


def scan_counts(counts: torch.Tensor, offsets: torch.Tensor, work: dict | None, spec: WorkSpec | None,
                n_kv_blocks: int) -> None:
    """counts int32 [n, H, M] (entries per row) → CSR offsets [n, H, M + 1], and with `work` (the dict of
    `cuda.work_order.work_order`, leading dim n, filled in place) the attention kernel's work order: one launch of
    decode.cu's sift_decode_scan on the current stream."""
    n, H, M = counts.shape
    spec = spec or WorkSpec(1, 1, 1, 1)
    n_bins = n_kv_blocks + 1  # a part is never longer than its row, at most N entries
    if work:
        check_work_blocks(n_kv_blocks)
    launch(_functions(counts.device.index)["scan"], (n, 1, 1), (SCAN_THREADS, 1, 1), 4 * n_bins if work else 0,
           [("counts", "p", counts.data_ptr()), ("n_heads", "i", H), ("n_qblocks", "i", M),
            ("offsets", "p", offsets.data_ptr())]
           + [(k, "p", work[k].data_ptr() if work else 0) for k in ("tile_order", "n_active", "cap", "slot_base")]
           + [("per_step", "i", spec.per_step), ("ctas", "i", spec.ctas), ("split_max", "i", spec.split_max),
              ("min_blocks", "i", spec.min_blocks), ("n_bins", "i", n_bins)], counts.device)


def work_buffers(n: int, rows: int, split_max: int, device) -> dict[str, torch.Tensor]:
    """Uninitialised work-order arrays for n layers of `rows` rows (filled by `scan_counts`)."""
    sizes = {"tile_order": rows * split_max, "n_active": 1, "cap": 1, "slot_base": rows}
    return {k: torch.empty(n, max(1, size), dtype=torch.int32, device=device) for k, size in sizes.items()}


class CudaDecoder:
    """Bit vectors of one prompt (PromptBits on the GPU) → offsets int32 [n, H, M + 1] and indices int32
    [n, capacity] for layers `layers` (default: all), in canonical order (masked blocks first, each group
    descending)."""

    def __init__(self, bits, table: BlockTable, layers: range | None = None):
        check_device(bits.doc_start if bits.doc_start.numel() else bits.la, "the bit vectors")
        self.device = bits.la.device
        self.table = table.to(self.device)
        lay = bits.layout
        if lay.seq_len != table.seq_len:
            raise SiftError(f"the block table is for {table.seq_len} tokens, the prompt has {lay.seq_len}")
        self.layers = layers if layers is not None else range(bits.n_layers)
        self.H = bits.n_heads
        t = {}
        for name, dt in _BITS:
            x = getattr(bits, name)
            if x.device != self.device:
                raise SiftError("all PromptBits tensors must be on one device (PromptBits.to(device))")
            if not x.numel():
                x = torch.zeros(1, dtype=dt, device=self.device)
            elif x.dtype != dt or not x.is_contiguous():
                x = x.to(dt).contiguous()
            t[name] = x
        self._keep = t
        tab = self.table
        M, N, n = tab.n_query_blocks, tab.n_kv_blocks, len(self.layers)
        self.capacity = self.H * tab.causal_block_count()  # every causal block of every head: an upper bound
        self.offsets = torch.empty(n, self.H, M + 1, dtype=torch.int32, device=self.device)
        self.indices = torch.empty(n, max(1, self.capacity), dtype=torch.int32, device=self.device)
        if not (n and M and self.H):  # nothing to decode: empty lists, no tiles
            self.offsets.zero_()
            return
        common = [(k, "p", t[k].data_ptr()) for k, _ in _BITS]
        common += [(k, "p", getattr(tab, k).data_ptr()) for k in ("q_start", "q_len", "kv_start", "kv_len", "kv_doc")]
        common += [("n_docs", "i", len(lay.docs)), ("prefix_len", "i", lay.prefix_len),
                   ("docs_end", "i", lay.docs_end), ("seq_len", "i", lay.seq_len), ("tile", "i", bits.tile),
                   ("n_heads", "i", self.H), ("block_n", "i", tab.block_n), ("n_qblocks", "i", M),
                   ("n_kvblocks", "i", N), ("layer0", "i", self.layers.start)]
        fn = _functions(self.device.index)
        counts = torch.empty(n, self.H, M, dtype=torch.int32, device=self.device)
        grid = (M, -(-self.H // DEC_HEADS), n)
        launch(fn["count"], grid, (DEC_THREADS, 1, 1), 0, common + [("counts", "p", counts.data_ptr())],
               self.device)
        scan_counts(counts, self.offsets, None, None, N)
        launch(fn["write"], grid, (DEC_THREADS, 1, 1), 0,
               common + [("offsets", "p", self.offsets.data_ptr()), ("indices", "p", self.indices.data_ptr()),
                         ("capacity", "l", self.indices.shape[1])], self.device)
        self._counts = counts  # alive until the launches run

    def layer(self, layer: int) -> BlockLists:
        i = layer - self.layers.start
        if not 0 <= i < len(self.layers):
            raise SiftError(f"layer {layer} is outside the decoded range {self.layers}")
        return BlockLists(self.offsets[i], self.indices[i], self.table)


class DecodedLayers(Sequence):
    """Every layer's BlockLists of one CudaDecoder, each made when first asked for: the sparse attention reads
    the stacked arrays, and a view per layer would cost host time inside the time to first token."""

    def __init__(self, decoder: CudaDecoder):
        self._decoder = decoder
        self._made: dict[int, BlockLists] = {}

    def __len__(self) -> int:
        return len(self._decoder.layers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if i not in self._made:
            self._made[i] = self._decoder.layer(self._decoder.layers.start + i)
        return self._made[i]


def decode_layer_cuda(bits, table: BlockTable, layer: int) -> BlockLists:
    """SPEC §7 CSR lists of one layer, from bit vectors already on the GPU (identical to block_lists.decode_layer)."""
    return CudaDecoder(bits, table, layers=range(layer, layer + 1)).layer(layer)
