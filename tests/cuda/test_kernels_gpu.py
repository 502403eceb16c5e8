"""The bundled kernels on a Hopper GPU: attention equals the fp32 reference, decode equals
block_lists.decode_layer."""

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.hopper]

LENGTHS = (1, 127, 128, 129, 1000, 8192 + 17)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("mask", ["dense", "sparse"])
@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_attention_matches_reference(head_dim, block_n, L, mask, ratio):
    from sift_cli.cuda.checks import attention_case, make_block_lists

    if L > 4096 and ratio != 4:
        pytest.skip("long case runs once per config")
    h_kv = 1 if L > 4096 else 2
    H = ratio * h_kv
    seed = hash((head_dim, block_n, L, mask, ratio)) % 10_000
    blocks = make_block_lists(mask, H, L, block_n, seed=seed)
    r = attention_case(H, h_kv, L, head_dim, blocks, seed=seed + 1)
    assert r["nan_out"] == 0 and r["nan_lse"] == 0, r  # poisoned buffers fully written
    assert r["rel_err"] < 1e-2, r
    assert r["lse_max_abs_err"] < 1e-2, r


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_n", [64, 128])
def test_attention_on_decoded_block_lists(head_dim, block_n):
    from sift_cli.cuda.checks import attention_case, random_case_bits
    from sift_cli.block_lists import decode_layer

    rng = np.random.default_rng(head_dim + block_n)
    bits = random_case_bits(rng, 64, n_layers=1, n_heads=6, doc_lengths=[700, 1300, 90, 2000], prefix_len=45,
                              suffix_len=130, la_p=0.25, ca_p=0.1)
    blocks = decode_layer(bits, 0, 128, block_n).to("cuda")
    r = attention_case(6, 2, bits.layout.seq_len, head_dim, blocks, seed=3, std=2.0)
    assert r["ok"], r


def test_strided_inputs_and_backend():
    """q/k/v as transposed views of [L, H, D] (what a model produces) go straight to TMA, no copy."""
    import math

    from sift_cli.attention.cuda import CudaBackend
    from sift_cli.attention.reference import block_sparse_attention
    from sift_cli.cuda.checks import make_block_lists

    L, H, H_kv, D = 777, 6, 2, 128
    q = torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    k = torch.randn(L, H_kv, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    v = torch.randn(L, H_kv, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    blocks = make_block_lists("sparse", H, L, 64, seed=1)
    out, lse = CudaBackend().forward(q, k, v, blocks, 1 / math.sqrt(D), return_lse=True)
    ref, ref_lse = block_sparse_attention(q.float(), k.float(), v.float(), blocks, 1 / math.sqrt(D), True)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    assert float((lse - ref_lse).abs().max()) < 1e-2


@pytest.mark.parametrize("tile", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("block_n", [64, 128])
def test_decode_kernel_matches_pytorch(tile, block_n):
    from sift_cli.cuda.checks import decode_case, random_case_bits

    rng = np.random.default_rng(tile * 7 + block_n)
    for _ in range(3):
        r = decode_case(random_case_bits(rng, tile), block_n)
        assert r["ok"], r


def test_decode_kernel_short_unaligned_and_long():
    from sift_cli.cuda.checks import decode_case, random_case_bits

    rng = np.random.default_rng(5)
    short = random_case_bits(rng, 16, doc_lengths=[1, 5, 17, 3, 130, 2], prefix_len=13, suffix_len=1, la_p=0.2,
                               ca_p=0.5)
    long = random_case_bits(rng, 64, n_layers=2, n_heads=4, doc_lengths=[2048] * 7 + [333], prefix_len=50,
                              suffix_len=100, la_p=0.27, ca_p=0.06)
    for bits in (short, long):
        for bn in (64, 128):
            r = decode_case(bits, bn)
            assert r["ok"], r
