"""The reference statistics in bounded memory."""

import torch

from sift_cli.config import ProfileConfig
from sift_cli.profile.statistics import doc_attention_bits


def test_bounded_memory_chunks_give_the_same_bits():
    """A tiny statistics budget forces one head and one tile-row band at a time: same bits."""
    torch.manual_seed(0)
    q, k = torch.randn(6, 300, 16) * 2, torch.randn(2, 300, 16) * 2
    big = doc_attention_bits(q, k, 20, 280, 0.25, ProfileConfig(tile=16))
    small = doc_attention_bits(q, k, 20, 280, 0.25, ProfileConfig(tile=16, stats_budget_bytes=1))
    assert torch.equal(big[0], small[0]) and torch.equal(big[1], small[1])
