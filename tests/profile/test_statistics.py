"""The reference statistics in bounded memory."""

import pytest
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


@pytest.mark.parametrize("R,C", [(1, 1), (63, 65), (65, 63), (127, 129), (128, 128), (129, 1000)])
@pytest.mark.parametrize("mask", [False, True])
def test_band_tile_max_equals_padding_the_band(R, C, mask):
    """Columns first on a view of the band, then rows: the same maxima as padding the whole band to tiles."""
    import torch.nn.functional as F

    from sift_cli.profile.statistics import band_tile_max

    T, h, prefix = 64, 3, 5
    torch.manual_seed(R * C)
    band = torch.rand(h, R, prefix + C)[:, :, prefix:]  # a strided slice, as probability_bands yields
    causal = torch.rand(R, C) > 0.3
    ref = band.masked_fill(~causal, -1.0) if mask else band
    ref = F.pad(ref, (0, -(-C // T) * T - C, 0, -(-R // T) * T - R), value=-1.0)
    ref = ref.view(h, ref.shape[1] // T, T, ref.shape[2] // T, T).amax(dim=(2, 4))
    assert torch.equal(band_tile_max(band, causal, T, mask=mask), ref)
