"""Threshold-free document statistics give exactly the bits profiling stores."""

import pytest
import torch

from sift_cli.config import ProfileConfig
from sift_cli.lab.eval.thresholds import collect_stats, derive_bits
from sift_cli.profile.forward import profile_batch
from sift_cli.tokens import prefix_token_ids, tokenize_documents


@pytest.mark.parametrize("tile,alpha,beta,gamma", [(16, 1e-3, 1e-2, 0.1), (32, 1e-2, 3e-2, 0.3),
                                                   (64, 3e-3, 1e-2, 0.05), (16, 0.0, 0.0, 0.0)])
def test_threshold_free_statistics_give_the_profile_bits(tiny_lm, tiny_docs, tile, alpha, beta, gamma):
    docs = list(tiny_docs.values())
    tokens = tokenize_documents(tiny_lm.tokenizer, docs)
    prefix = prefix_token_ids(tiny_lm.tokenizer)
    stats = collect_stats(tiny_lm.model, prefix, tokens, 16, (0.0, 1e-2, 3e-2))
    want = profile_batch(tiny_lm.model, prefix, tokens, ProfileConfig(tile=tile, alpha=alpha, beta=beta, gamma=gamma))
    for st, w in zip(stats, want):
        la, ca = derive_bits(st, tile, alpha, beta, gamma)
        assert torch.equal(la, w.la_tiles), "LA bits differ"
        assert torch.equal(ca, w.ca_pages), "CA bits differ"
