"""The sink+window baseline at a requested block density."""

from sift_cli.lab.eval.static import matched_sink_window, sink_window_mask
from sift_cli.layout import PromptLayout


def test_sink_window_matches_the_requested_density():
    lay = PromptLayout.build(20, ["a", "b", "c"], [300, 400, 500], 40)
    full = sink_window_mask(lay, 10 ** 6, 128, 64)
    assert full.sum() == sum(1 for m in range(full.shape[0]) for n in range(full.shape[1])
                             if n * 64 <= min(lay.seq_len, (m + 1) * 128) - 1)
    for target in (0.2, 0.5, 0.9):
        blocks, w = matched_sink_window(lay, target, 3)
        assert blocks.density() >= target - 1e-9
        if w > 1:
            smaller = sink_window_mask(lay, w - 1, 128, 64)
            assert smaller.sum() / full.sum() < target
    m = sink_window_mask(lay, 1, 128, 64)
    assert m[:, 0].all()  # the sink block is always computed
    assert m[-1].sum() == full[-1].sum()  # suffix rows stay dense
