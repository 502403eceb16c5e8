"""The real bundled model: profile bits equal the brute-force reference from its eager attention."""

import pytest

from sift_cli.models import load_model, prefix_token_ids
from sift_cli.profile import ProfileConfig, profile_batch
from sift_cli.sample import sample_documents

from .helpers import brute_force_bits, eager_attentions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    return load_model(None, device="cpu")


@pytest.fixture(scope="module")
def text_tokens(smol):
    text = " ".join(t for _, t in sample_documents())
    return smol.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("tile,n", [(64, 1), (64, 63), (64, 64), (64, 65), (16, 15), (16, 17), (128, 129),
                                    (64, 1000), (16, 1000), (128, 1000)])
def test_bits_equal_brute_force(smol, text_tokens, tile, n):
    prefix = prefix_token_ids(smol.tokenizer)
    doc = text_tokens[3000: 3000 + n]
    cfg = ProfileConfig(tile=tile)
    got = profile_batch(smol.model, prefix, [doc], cfg)[0]
    for layer, A in enumerate(eager_attentions(smol.model, prefix + doc)):
        la, ca = brute_force_bits(A, len(prefix), n, tile, cfg.alpha, cfg.beta, cfg.gamma)
        assert (got.la_tiles[layer].numpy() == la).all(), f"LA differs at layer {layer}"
        assert (got.ca_pages[layer].numpy() == ca).all(), f"CA differs at layer {layer}"


def test_model_facts(smol):
    assert (smol.n_layers, smol.n_heads, smol.n_kv_heads, smol.head_dim, smol.max_context) == (30, 9, 3, 64, 8192)
    assert smol.fingerprint.startswith("sha256:b179c952")
    assert smol.tokenizer.decode(prefix_token_ids(smol.tokenizer)).endswith("<|im_start|>user\n")
