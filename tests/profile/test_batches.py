"""Documents into padded batches."""

import torch

from sift_cli.profile.batches import padded_batch, plan_batches


def test_plan_batches_respects_budget_and_is_deterministic():
    lengths = [10, 500, 30, 30, 2000, 7, 64]
    batches = plan_batches(lengths, 8, 1024)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] + 8 for i in b) * len(b) <= 1024
    assert batches == plan_batches(lengths, 8, 1024)


def test_padded_batch_is_prefix_and_document_right_padded():
    ids = padded_batch([1, 2], [[5, 6, 7], [8]])
    assert ids.dtype == torch.int64
    assert ids.tolist() == [[1, 2, 5, 6, 7], [1, 2, 8, 0, 0]]
