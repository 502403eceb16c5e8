"""FlexAttention backend against the reference on a GPU (random masks and masks decoded from bits)."""

import numpy as np
import pytest
import torch

from sift_cli.attention.reference import block_sparse_attention
from sift_cli.block_lists import block_lists_from_mask, decode_layer, dense_block_lists

from ..test_block_lists import random_prompt

pytestmark = pytest.mark.gpu


def random_block_lists(H, L, bm, bn, density, seed):
    g = torch.Generator().manual_seed(seed)
    M, N = -(-L // bm), -(-L // bn)
    q_last = torch.clamp(torch.arange(M) * bm + bm, max=L) - 1
    causal = torch.arange(N)[None, :] * bn <= q_last[:, None]
    mask = (torch.rand(H, M, N, generator=g) < density) & causal[None]
    q_first = torch.arange(M) * bm
    for kb in range(N):  # blocks holding a row's own key are always listed (as decode guarantees)
        mask[:, (q_first // bn <= kb) & (kb <= q_last // bn), kb] = True
    return block_lists_from_mask(mask, bm, bn, L)


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("L,D,H,H_kv", [(1, 64, 9, 3), (129, 128, 4, 4), (1000, 64, 9, 3), (4113, 128, 8, 2)])
@pytest.mark.parametrize("density", [1.0, 0.3])
def test_flex_equals_reference(L, D, H, H_kv, density):
    from sift_cli.attention.flex import FlexBackend

    torch.manual_seed(L + D)
    dev = torch.device("cuda")
    q = torch.randn(H, L, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(H_kv, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(H_kv, L, D, device=dev, dtype=torch.bfloat16)
    lay = (dense_block_lists(L, H, 128, 64, dev) if density == 1.0
           else random_block_lists(H, L, 128, 64, density, L).to(dev))
    ref, ref_lse = block_sparse_attention(q, k, v, lay, D ** -0.5, return_lse=True)
    out, lse = FlexBackend().forward(q, k, v, lay, D ** -0.5, return_lse=True)
    assert torch.isfinite(out.float()).all()
    assert rel_err(out, ref) < 2e-2
    assert float((lse - ref_lse).abs().max()) < 2e-2


def test_flex_on_decoded_bits():
    from sift_cli.attention.flex import FlexBackend

    rng = np.random.default_rng(5)
    pb, _ = random_prompt(rng, 64, n_heads=9, doc_lengths=[700, 90, 1300, 33], prefix_len=30, suffix_len=45)
    dev = torch.device("cuda")
    lay = decode_layer(pb.to(dev), 1)
    L = pb.layout.seq_len
    q = torch.randn(9, L, 64, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(3, L, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
    ref = block_sparse_attention(q, k, v, lay, 0.125)
    out = FlexBackend().forward(q, k, v, lay, 0.125)
    assert rel_err(out, ref) < 2e-2
    assert torch.equal(lay.indices.cpu(), decode_layer(pb, 1).indices)  # decode agrees across devices


@pytest.mark.parametrize("backend", ["flex", "cuda"])
def test_backends_on_masks_from_real_profiles(tmp_path, tiny_lm, small_corpus, backend):
    """Layouts decoded from bits that `sift profile` wrote (a real model's attention), not random ones."""
    from sift_cli.attention.backends import get_backend
    from sift_cli.profile.job import profile_corpus
    from sift_cli.config import ProfileConfig
    from sift_cli.prompt import assemble
    from sift_cli.shards.reader import ShardSet

    if backend == "cuda":
        from sift_cli.attention.cuda import CudaBackend

        usable, why = CudaBackend.available()
        if not usable:
            pytest.skip(why)
    profile_corpus(small_corpus, tmp_path / "s", tiny_lm, ProfileConfig(tile=16, alpha=0.01, beta=0.05, gamma=0.2),
                   num_shards=1)
    prompt = assemble(ShardSet(tmp_path / "s"), tiny_lm, ["doc03", "doc07", "doc01", "doc09"], "Which fox?")
    dev = torch.device("cuda")
    bits = prompt.bits.to(dev)
    L, H = prompt.layout.seq_len, tiny_lm.n_heads
    be = get_backend(backend, dev)
    densities = []
    for layer in range(tiny_lm.n_layers):
        lay = decode_layer(bits, layer)
        densities.append(lay.density())
        q = torch.randn(H, L, 64, device=dev, dtype=torch.bfloat16)  # head_dim 64: what the kernels support
        k, v = (torch.randn(tiny_lm.n_kv_heads, L, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
        ref = block_sparse_attention(q, k, v, lay, 0.125)
        out = be.forward(q, k, v, lay, 0.125)
        assert rel_err(out, ref) < 2e-2, (backend, layer)
    assert min(densities) < 1.0  # the profile really is sparse somewhere
