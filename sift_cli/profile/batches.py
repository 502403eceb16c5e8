"""Documents into padded batches: which documents run together (`plan_batches`), the right-padded token ids of one
batch (`padded_batch`), and copying to the device without making the host wait (`to_device`).

Right padding is harmless under causal attention: a real token never sees a pad token.
"""

from __future__ import annotations

import numpy as np
import torch


def plan_batches(lengths: list[int], prefix_len: int, batch_tokens: int) -> list[list[int]]:
    """Group document indices into padded batches of at most `batch_tokens` tokens (a longer document runs alone).

    Documents are taken in order of length, so a batch wastes little on padding; the grouping depends only on
    the lengths given, which keeps output deterministic.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, current, longest = [], [], 0
    for i in order:
        size = prefix_len + lengths[i]
        if current and max(longest, size) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    return batches


def padded_batch(prefix_ids: list[int], docs: list[list[int]], pad: int = 0) -> torch.Tensor:
    """int64 [len(docs), prefix + longest doc]: `prefix ‖ doc` per row, right-padded with `pad`."""
    longest = len(prefix_ids) + max(len(d) for d in docs)
    rows = np.full((len(docs), longest), pad, dtype=np.int64)
    rows[:, : len(prefix_ids)] = prefix_ids
    for i, d in enumerate(docs):
        rows[i, len(prefix_ids): len(prefix_ids) + len(d)] = d
    return torch.from_numpy(rows)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host → device without making the host wait for the GPU (a pageable copy can; a pinned one does not)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
