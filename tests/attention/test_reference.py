"""The reference backend's banded mode equals its full computation."""

import pytest
import torch

from sift_cli.attention.reference import ReferenceBackend, banded_block_sparse_attention, block_sparse_attention
from sift_cli.block_lists import block_lists_from_mask
from sift_cli.lab.eval.backend import eval_backend


@pytest.mark.parametrize("L,bm,bn,H,Hkv,rows", [(200, 128, 64, 4, 2, 128), (333, 64, 64, 6, 3, 64),
                                                 (129, 128, 128, 2, 2, 512)])
def test_banded_reference_equals_reference(L, bm, bn, H, Hkv, rows):
    torch.manual_seed(L)
    M, N = -(-L // bm), -(-L // bn)
    mask = torch.rand(H, M, N) < 0.4
    q_last = torch.clamp(torch.arange(M) * bm + bm, max=L) - 1
    k_first = torch.arange(N) * bn
    mask &= (k_first[None, :] <= q_last[:, None])[None]
    mask |= ((k_first[None, :] <= q_last[:, None]) & (k_first[None, :] + bn > q_last[:, None] - bm + 1))[None]
    lay = block_lists_from_mask(mask, bm, bn, L)
    q, k, v = torch.randn(H, L, 16), torch.randn(Hkv, L, 16), torch.randn(Hkv, L, 16)
    a = banded_block_sparse_attention(q, k, v, lay, 0.3, rows=rows)
    b = block_sparse_attention(q, k, v, lay, 0.3)
    assert torch.allclose(a, b, atol=2e-6), (a - b).abs().max()
    assert eval_backend("auto", torch.device("cpu")).name == "reference"
    banded = eval_backend("reference", torch.device("cpu"))
    assert isinstance(banded, ReferenceBackend) and banded.rows is not None
