"""Segments of an assembled prompt: prefix ‖ doc_1 ‖ … ‖ doc_n ‖ suffix (SPEC §2), and their bits.

`PromptLayout` is plain offsets; `PromptBits` packs every document's LA and CA vectors (all layers and heads)
into two flat uint8 tensors with per-document byte offsets, the form both decoders (PyTorch and CUDA) read.
A document without bits (not profiled yet) is *dense*: no bytes, `doc_dense[d] = 1`; its rows see every earlier
key and every later document sees all of its keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection

import numpy as np
import torch

from .bits import ca_nbytes, la_nbytes, n_pages, n_tiles, pack_doc
from .device_copy import DeviceTensors


@dataclass(frozen=True)
class DocSpan:
    doc_id: str
    start: int  # global offset of the document's first token
    n_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass(frozen=True)
class PromptLayout:
    prefix_len: int
    docs: tuple[DocSpan, ...]
    suffix_len: int

    @property
    def docs_end(self) -> int:
        return self.docs[-1].end if self.docs else self.prefix_len

    @property
    def seq_len(self) -> int:
        return self.docs_end + self.suffix_len

    @staticmethod
    def build(prefix_len: int, doc_ids: list[str], doc_lengths: list[int], suffix_len: int) -> "PromptLayout":
        spans, pos = [], prefix_len
        for doc_id, n in zip(doc_ids, doc_lengths):
            spans.append(DocSpan(doc_id, pos, n))
            pos += n
        return PromptLayout(prefix_len, tuple(spans), suffix_len)


@dataclass
class PromptBits(DeviceTensors):
    """All documents' bit vectors for one prompt, packed for the decoders.

    la[la_base[d] + (layer * H + h) * la_len[d] : ... + la_len[d]] is the LA vector of doc d, layer, head h;
    likewise ca with ca_base / ca_len. doc_start / doc_len are global token offsets; tile is T. A dense document
    (doc_dense[d] = 1) has la_len[d] = ca_len[d] = 0.
    """

    tile: int
    n_layers: int
    n_heads: int
    la: torch.Tensor  # uint8 [sum of LA blob sizes]
    ca: torch.Tensor  # uint8 [sum of CA blob sizes]
    doc_start: torch.Tensor  # int32 [D]
    doc_len: torch.Tensor  # int32 [D]
    la_base: torch.Tensor  # int64 [D]
    la_len: torch.Tensor  # int32 [D]
    ca_base: torch.Tensor  # int64 [D]
    ca_len: torch.Tensor  # int32 [D]
    doc_dense: torch.Tensor  # int32 [D]: 1 where the document has no bits
    layout: PromptLayout = field(repr=False)

    @staticmethod
    def pack(layout: PromptLayout, la_blobs: list[bytes | None], ca_blobs: list[bytes | None], tile: int,
             n_layers: int, n_heads: int) -> "PromptBits":
        """None for a document's blobs (both) makes it dense."""
        la_base, ca_base, la_len, ca_len, dense = [], [], [], [], []
        la_pos = ca_pos = 0
        la_blobs, ca_blobs = list(la_blobs), list(ca_blobs)
        for i, (span, la, ca) in enumerate(zip(layout.docs, la_blobs, ca_blobs)):
            dense.append(int(la is None))
            if la is None or ca is None:
                if la is not None or ca is not None:
                    raise ValueError(f"{span.doc_id!r}: give both bit vectors or neither")
                la_blobs[i] = ca_blobs[i] = la = ca = b""
                lb = cb = 0
            else:
                p = n_pages(span.n_tokens, tile)
                lb, cb = la_nbytes(p), ca_nbytes(p)
                if len(la) != lb * n_layers * n_heads or len(ca) != cb * n_layers * n_heads:
                    raise ValueError(f"bit vectors of {span.doc_id!r} do not match {span.n_tokens} tokens "
                                     f"at T={tile}")
            la_base.append(la_pos)
            ca_base.append(ca_pos)
            la_len.append(lb)
            ca_len.append(cb)
            la_pos += len(la)
            ca_pos += len(ca)

        def u8(blobs):
            joined = b"".join(blobs)
            return torch.frombuffer(bytearray(joined), dtype=torch.uint8) if joined else torch.zeros(0, dtype=torch.uint8)

        i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
        i64 = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
        return PromptBits(
            tile=tile, n_layers=n_layers, n_heads=n_heads, la=u8(la_blobs), ca=u8(ca_blobs),
            doc_start=i32([d.start for d in layout.docs]), doc_len=i32([d.n_tokens for d in layout.docs]),
            la_base=i64(la_base), la_len=i32(la_len), ca_base=i64(ca_base), ca_len=i32(ca_len),
            doc_dense=i32(dense), layout=layout,
        )

    TENSORS = ("la", "ca", "doc_start", "doc_len", "la_base", "la_len", "ca_base", "ca_len", "doc_dense")

    def dense_docs(self) -> list[int]:
        """Indices of the documents without bits."""
        return [d for d, flag in enumerate(self.doc_dense.tolist()) if flag]

    def without_bits(self) -> bool:
        """No document has bits (each is dense, or there is none): SIFT's block mask is then the causal mask."""
        return len(self.dense_docs()) == len(self.layout.docs)

    def dense_share(self) -> float:
        """The share of the documents' tokens without bits (computed densely); 0 without documents."""
        docs = self.layout.docs
        total = sum(d.n_tokens for d in docs)
        return sum(docs[i].n_tokens for i in self.dense_docs()) / total if total else 0.0

    def selected_share(self) -> float:
        """The share of the documents' LA tiles and CA pages whose bit is set, over every layer and head; a
        document without bits counts as all set, and 1.0 without documents. A host-side measure of how dense the
        prompt's selection is (the CUDA backend's query block choice); the padding bits SPEC §4 zeroes count for
        nothing."""
        pages = [n_pages(d.n_tokens, self.tile) for d in self.layout.docs]
        per_doc = np.array([n_tiles(p) + p for p in pages], dtype=np.int64) * self.n_layers * self.n_heads
        if per_doc.sum() == 0:
            return 1.0
        dense = self.doc_dense.cpu().numpy().astype(bool)
        set_bits = sum(int(np.bitwise_count(t.cpu().numpy()).sum(dtype=np.int64)) for t in (self.la, self.ca))
        return (set_bits + int(per_doc[dense].sum())) / int(per_doc.sum())

    def nbytes(self) -> int:
        return int(self.la.numel() + self.ca.numel())


def random_prompt_bits(layout: PromptLayout, tile: int, n_layers: int, n_heads: int,
                       la_p: float | Callable[[int], float], ca_p: float, rng, dense: Collection[int] = ()
                       ) -> tuple[PromptBits, list]:
    """Bits drawn at random for every document of `layout` (benchmarks and tests): each LA tile below the diagonal
    is set with probability la_p (the diagonal always), each CA page with probability ca_p. la_p may depend on
    the document's page count: a function of it.

    Returns the packed bits and, per document, the drawn (bool [L, H, P, P], bool [L, H, P]) arrays.
    rng: a numpy Generator.
    """
    la_blobs, ca_blobs, drawn = [], [], []
    for d, span in enumerate(layout.docs):
        if d in dense:
            la_blobs.append(None)
            ca_blobs.append(None)
            drawn.append(None)
            continue
        p = n_pages(span.n_tokens, tile)
        la = np.tril(rng.random((n_layers, n_heads, p, p)) < (la_p(p) if callable(la_p) else la_p))
        la[:, :, np.arange(p), np.arange(p)] = True
        ca = rng.random((n_layers, n_heads, p)) < ca_p
        a, c = pack_doc(la, ca)
        la_blobs.append(a)
        ca_blobs.append(c)
        drawn.append((la, ca))
    return PromptBits.pack(layout, la_blobs, ca_blobs, tile, n_layers, n_heads), drawn
