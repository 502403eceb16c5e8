import pytest
import torch

from sift_cli.config import ProfileConfig
from sift_cli.profile.forward import profile_batch

from ..helpers import brute_force_bits, eager_attentions, tiny_llama

PREFIX = [1, 17, 29, 5, 88]


def random_doc(n, seed, vocab=211):
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def check_doc(model, doc, cfg):
    got = profile_batch(model, PREFIX, [doc], cfg)[0]
    attn = eager_attentions(model, PREFIX + doc)
    for layer, A in enumerate(attn):
        la, ca = brute_force_bits(A, len(PREFIX), len(doc), cfg.tile, cfg.alpha, cfg.beta, cfg.gamma)
        assert (got.la_tiles[layer].numpy() == la).all(), f"LA layer {layer}"
        assert (got.ca_pages[layer].numpy() == ca).all(), f"CA layer {layer}"


@pytest.mark.parametrize("tile", [16, 64, 128])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_bits_equal_brute_force_near_tile(tile, delta):
    model = tiny_llama(seed=tile + delta)
    n = max(1, tile + delta)
    check_doc(model, random_doc(n, tile * 7 + delta), ProfileConfig(tile=tile))


@pytest.mark.parametrize("n", [1, 1000])
@pytest.mark.parametrize("tile", [16, 64, 128])
def test_bits_equal_brute_force_lengths(n, tile):
    model = tiny_llama(seed=n)
    check_doc(model, random_doc(n, n + tile), ProfileConfig(tile=tile, alpha=0.002, beta=0.02, gamma=0.05))


def test_batched_equals_single():
    model = tiny_llama(seed=3)
    docs = [random_doc(n, n) for n in (5, 64, 200, 130)]
    cfg = ProfileConfig(tile=32)
    batched = profile_batch(model, PREFIX, docs, cfg)
    for doc, got in zip(docs, batched):
        alone = profile_batch(model, PREFIX, [doc], cfg)[0]
        assert torch.equal(got.la_tiles, alone.la_tiles) and torch.equal(got.ca_pages, alone.ca_pages)


def test_zero_thresholds_select_everything():
    model = tiny_llama(seed=5)
    got = profile_batch(model, PREFIX, [random_doc(150, 1)], ProfileConfig(tile=16, alpha=0, beta=0, gamma=0))[0]
    P = got.ca_pages.shape[-1]
    assert got.ca_pages.all()
    assert (got.la_tiles == torch.ones(P, P, dtype=torch.bool).tril()).all()
