"""Packing a whole batch's bits at once (the fast path's `_batch_doc_bits`) gives exactly what the per-document
DocBits methods give: the same bytes, the same densities (float for float)."""

import numpy as np
import pytest
import torch

from sift_cli.bits import pack_doc
from sift_cli.profile.doc_bits import DocBits, batch_doc_bits


@pytest.mark.parametrize("L,H,tile,max_pages,B", [(30, 9, 64, 5, 40), (2, 4, 16, 17, 9), (3, 2, 64, 1, 5),
                                                   (4, 8, 128, 9, 6)])
def test_batch_packing_equals_per_document(L, H, tile, max_pages, B):
    g = torch.Generator().manual_seed(L * H + B)
    rng = np.random.default_rng(B)
    lengths = [int(x) for x in rng.integers(1, max_pages * tile + 1, B)]
    P = max(-(-n // tile) for n in lengths)
    la = (torch.rand(B, L, H, P, P, generator=g) > 0.6) & torch.ones(P, P, dtype=torch.bool).tril()
    ca = torch.rand(B, L, H, P, generator=g) > 0.85
    docs = batch_doc_bits(la, ca, lengths, tile)()
    for b, (d, n) in enumerate(zip(docs, lengths)):
        p = -(-n // tile)
        ref = DocBits(la[b, :, :, :p, :p], ca[b, :, :, :p])
        assert d.pack() == ref.pack() == pack_doc(ref.la_tiles, ref.ca_pages)
        assert d.la_density() == ref.la_density() and d.ca_density() == ref.ca_density()
        assert torch.equal(d.la_tiles, ref.la_tiles) and torch.equal(d.ca_pages, ref.ca_pages)


def test_ca_density_division_matches_torch_mean():
    """The batch path divides the exact count by the size in fp32; DocBits.ca_density takes torch's mean."""
    rng = np.random.default_rng(0)
    for n in (30 * 9 * 3, 32 * 32 * 17, 24, 30 * 9 * 129):
        for c in [0, 1, n - 1, n] + rng.integers(0, n + 1, 40).tolist():
            x = torch.zeros(n, dtype=torch.bool)
            x[:c] = True
            assert float(x.float().mean()) == float(np.float32(c) / np.float32(n))


@pytest.mark.gpu
def test_batch_packing_on_the_gpu_equals_per_document():
    g = torch.Generator().manual_seed(0)
    lengths = [8191, 3000, 64, 65, 1]
    L, H, tile = 4, 32, 64
    P = -(-max(lengths) // tile)
    la = (torch.rand(5, L, H, P, P, generator=g) > 0.6) & torch.ones(P, P, dtype=torch.bool).tril()
    ca = torch.rand(5, L, H, P, generator=g) > 0.85
    docs = batch_doc_bits(la.cuda(), ca.cuda(), lengths, tile)()
    for b, (d, n) in enumerate(zip(docs, lengths)):
        p = -(-n // tile)
        ref = DocBits(la[b, :, :, :p, :p], ca[b, :, :, :p])
        assert d.pack() == ref.pack()
        assert d.la_density() == ref.la_density() and d.ca_density() == ref.ca_density()
