"""`DocBits`, the bits of one document (all layers and heads), and the fast path's packing of a whole batch's bits
on the device (`batch_doc_bits`): the same bytes and densities as the per-document methods, without per-document
host work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..bits import n_pages, pack_doc
from .batches import to_device


@dataclass
class DocBits:
    """Bits of one document, all layers and heads."""

    la_tiles: torch.Tensor  # bool [L, H, P, P] lower triangle
    ca_pages: torch.Tensor  # bool [L, H, P]
    # Filled for a whole batch at once by the fast path (`batch_doc_bits`); the same values as computed below.
    packed: tuple[bytes, bytes] | None = field(default=None, repr=False, compare=False)
    densities: tuple[float, float] | None = field(default=None, repr=False, compare=False)

    def pack(self) -> tuple[bytes, bytes]:
        return self.packed if self.packed is not None else pack_doc(self.la_tiles, self.ca_pages)

    def la_density(self) -> float:
        if self.densities is not None:
            return self.densities[0]
        p = self.ca_pages.shape[-1]
        return float(self.la_tiles.sum()) / (self.la_tiles.shape[0] * self.la_tiles.shape[1] * p * (p + 1) / 2)

    def ca_density(self) -> float:
        if self.densities is not None:
            return self.densities[1]
        return float(self.ca_pages.float().mean())


def batch_doc_bits(la: torch.Tensor, ca: torch.Tensor, lengths: list[int], tile: int
                    ) -> Callable[[], list[DocBits]]:
    """Per-document DocBits from batch tensors la bool [B, L, H, P, P], ca bool [B, L, H, P] (on the GPU in the
    fast path), with the packed vectors and densities computed on that device for all documents of one page
    count at once: bytes and values identical to `pack_doc` and the DocBits methods (tested), without per-document
    numpy work, which costs more than the GPU work on short passages and ~0.3 s per 8K-token document at 8B.
    Enqueues the work and the copies to the host; the returned function waits for them and builds the DocBits."""
    groups: dict[int, list[int]] = {}
    for b, n in enumerate(lengths):
        groups.setdefault(n_pages(n, tile), []).append(b)
    _, L, H = la.shape[:3]
    dev = la.device
    weights = 2 ** torch.arange(7, -1, -1, dtype=torch.int32, device=dev)  # 128 … 1: MSB first

    def packbits(bits: torch.Tensor) -> torch.Tensor:  # [..., n] bool → [..., ceil(n/8)] uint8, MSB first
        x = F.pad(bits.to(torch.int32), (0, -bits.shape[-1] % 8))
        return (x.view(*x.shape[:-1], -1, 8) * weights).sum(-1).to(torch.uint8)

    def to_host(t: torch.Tensor) -> torch.Tensor:  # pinned and asynchronous on CUDA: read only after `done`
        return t.to("cpu", non_blocking=dev.type == "cuda")

    pending = []
    for P, idx in groups.items():
        G = len(idx)
        sel = to_device(torch.tensor(idx), dev)
        la_g, ca_g = la.index_select(0, sel)[..., :P, :P], ca.index_select(0, sel)[..., :P]
        rows, cols = torch.tril_indices(P, P, device=dev)
        flat = la_g[..., rows, cols].reshape(G, L * H, -1)  # row-major lower triangle, as pack_la
        pending.append((P, idx, to_host(packbits(flat)), to_host(packbits(ca_g.reshape(G, L * H, P))),
                        to_host(flat.reshape(G, -1).sum(1)), to_host(ca_g.reshape(G, -1).sum(1)),
                        to_host(la_g), to_host(ca_g)))
    done = torch.cuda.Event() if dev.type == "cuda" else None
    if done is not None:
        done.record()

    def collect() -> list[DocBits]:
        if done is not None:
            done.synchronize()
        out: list[DocBits | None] = [None] * len(lengths)
        for P, idx, la_bytes, ca_bytes, la_sum, ca_cnt, la_cpu, ca_cpu in pending:
            la_bytes, ca_bytes, la_sum = la_bytes.numpy(), ca_bytes.numpy(), la_sum.tolist()
            # fp32 count / size: what DocBits.ca_density's torch mean gives (the count is exact; tested)
            ca_mean = (ca_cnt.numpy().astype(np.float32) / np.float32(L * H * P)).tolist()
            tiles = L * H * P * (P + 1) / 2
            for j, b in enumerate(idx):
                out[b] = DocBits(la_cpu[j], ca_cpu[j], packed=(la_bytes[j].tobytes(), ca_bytes[j].tobytes()),
                                 densities=(float(la_sum[j]) / tiles, ca_mean[j]))
        return out

    return collect
