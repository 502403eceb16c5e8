"""The sink+window baseline at a requested block density, over the prompt's document-aligned block table."""

from sift_cli.block_table import BlockTable
from sift_cli.lab.eval.static import matched_sink_window, sink_window_mask
from sift_cli.layout import PromptLayout


def test_sink_window_matches_the_requested_density():
    lay = PromptLayout.build(20, ["a", "b", "c"], [300, 400, 500], 40)
    table = BlockTable.for_layout(lay, 128, 64)
    full = sink_window_mask(lay, table, 10 ** 6)
    assert full.sum() == table.causal_block_count()
    for target in (0.2, 0.5, 0.9):
        blocks, w = matched_sink_window(lay, table, target, 3)
        assert blocks.density() >= target - 1e-9
        if w > 1:
            smaller = sink_window_mask(lay, table, w - 1)
            assert smaller.sum() / full.sum() < target
    m = sink_window_mask(lay, table, 1)
    assert m[:, 0].all()  # the sink block is always computed
    assert m[-1].sum() == full[-1].sum()  # suffix rows stay dense
