"""The two-pass bit-vector decoder of kernels/decode.cu: bits → CSR block lists on the GPU, exactly the lists of
`block_lists.decode_layer`.

`CudaDecoder(bits_on_gpu, block_m, block_n).layer(l)` or `decode_layer_cuda(...)` for one layer.
"""

from __future__ import annotations

import numpy as np
import torch

from ..attention.base import BlockLists
from ..errors import SiftError
from .runtime import check_device, compiled_module, launch

DEC_THREADS = 128
SCAN_THREADS = 1024


def _decode_kernels(device_index: int):
    mod = compiled_module("decode.cu", (), device_index)
    return (mod.get_function("sift_decode_count"), mod.get_function("sift_decode_write"),
            mod.get_function("sift_decode_scan"))


class CudaDecoder:
    """Bit vectors of one prompt, on the GPU once; CSR block lists per layer from kernels/decode.cu.

    Pass 1 runs for every layer in one launch when the decoder is built (counts → offsets with torch.cumsum,
    one device→host copy of the per-layer totals); `layer(l)` then runs pass 2 only, with no host sync.
    """

    def __init__(self, bits, block_m: int = 128, block_n: int = 64, layers: range | None = None):
        check_device(bits.la if bits.la.numel() else bits.doc_start, "the bit vectors")
        self.bits = bits
        self.device = bits.la.device
        self.block_m, self.block_n = block_m, block_n
        lay = bits.layout
        self.seq_len = lay.seq_len
        self.H = bits.n_heads
        self.M = -(-self.seq_len // block_m)
        self.layers = layers if layers is not None else range(bits.n_layers)
        t = {k: getattr(bits, k).contiguous() for k in
             ("la", "ca", "doc_start", "doc_len", "la_base", "la_len", "ca_base", "ca_len")}
        for name, dt in (("doc_start", torch.int32), ("doc_len", torch.int32), ("la_base", torch.int64),
                         ("la_len", torch.int32), ("ca_base", torch.int64), ("ca_len", torch.int32),
                         ("la", torch.uint8), ("ca", torch.uint8)):
            if t[name].dtype != dt:
                t[name] = t[name].to(dt)
            if t[name].device != self.device:
                raise SiftError("all PromptBits tensors must be on one device (PromptBits.to(device))")
        self._keep = t
        self.common = (t["la"].data_ptr(), t["ca"].data_ptr(), t["doc_start"].data_ptr(), t["doc_len"].data_ptr(),
                       t["la_base"].data_ptr(), t["la_len"].data_ptr(), t["ca_base"].data_ptr(),
                       t["ca_len"].data_ptr(), np.int32(len(lay.docs)), np.int32(lay.prefix_len),
                       np.int32(lay.docs_end), np.int32(self.seq_len), np.int32(bits.tile), np.int32(self.H),
                       np.int32(block_m), np.int32(block_n), np.int32(self.M))
        self.k_count, self.k_write, self.k_scan = _decode_kernels(self.device.index)
        self.offsets = self.count(self.layers.start, len(self.layers))  # [n, H, M + 1]
        self.nnz = self.offsets[:, -1, -1].tolist() if len(self.layers) else []

    def count(self, layer0: int, n_layers: int) -> torch.Tensor:
        """Pass 1 + prefix sum for layers layer0 .. layer0 + n_layers - 1 → offsets int32 [n, H, M + 1]."""
        H, M = self.H, self.M
        counts = torch.empty(n_layers, H, M, dtype=torch.int32, device=self.device)
        offsets = torch.zeros(n_layers, H, M + 1, dtype=torch.int32, device=self.device)
        if n_layers and M and H:
            launch(self.k_count, (M, H, n_layers), (DEC_THREADS, 1, 1),
                    self.common + (np.int32(layer0), counts.data_ptr()), 0, self.device)
            launch(self.k_scan, (n_layers, 1, 1), (SCAN_THREADS, 1, 1),
                    (counts.data_ptr(), np.int32(H), np.int32(M), offsets.data_ptr()), 0, self.device)
        return offsets

    def write(self, layer: int, offsets: torch.Tensor, indices: torch.Tensor) -> None:
        """Pass 2 for one layer into a preallocated int32 index array."""
        if self.M:
            launch(self.k_write, (self.M, self.H, 1), (DEC_THREADS, 1, 1),
                    self.common + (np.int32(layer), offsets.data_ptr(), indices.data_ptr()), 0, self.device)

    def layer(self, layer: int) -> BlockLists:
        i = layer - self.layers.start
        if not 0 <= i < len(self.layers):
            raise SiftError(f"layer {layer} is outside the decoded range {self.layers}")
        offsets = self.offsets[i]
        indices = torch.empty(int(self.nnz[i]), dtype=torch.int32, device=self.device)
        self.write(layer, offsets, indices)
        return BlockLists(offsets, indices, self.block_m, self.block_n, self.seq_len)


def decode_layer_cuda(bits, layer: int, block_m: int = 128, block_n: int = 64) -> BlockLists:
    """SPEC §7 CSR lists of one layer, from bit vectors already on the GPU (identical to decode.decode_layer)."""
    return CudaDecoder(bits, block_m, block_n, layers=range(layer, layer + 1)).layer(layer)
