"""Many small host tensors moved to a GPU in one copy (a prompt's bit vectors and block table are a dozen
tensors, most of a few bytes: one copy each costs tens of microseconds of host time)."""

from __future__ import annotations

import torch

_ALIGN = 16
SMALL = 1 << 16  # bytes: tensors up to this size travel packed; larger ones (the bit blobs) are copied alone


def to_device(tensors: list[torch.Tensor], device) -> list[torch.Tensor]:
    """`tensors` on `device`, same dtypes and shapes. To a CUDA device, the small host tensors travel packed in
    one buffer and one copy and come back as (contiguous) views of it; every other tensor is moved alone."""
    device = torch.device(device)
    small = [i for i, t in enumerate(tensors) if t.device.type == "cpu" and t.numel() * t.element_size() <= SMALL]
    if device.type != "cuda" or len(small) < 2:
        return [t.to(device) for t in tensors]
    offsets, total = {}, 0
    for i in small:
        offsets[i] = total
        total += -(-tensors[i].numel() * tensors[i].element_size() // _ALIGN) * _ALIGN
    host = torch.empty(max(total, _ALIGN), dtype=torch.uint8)
    for i in small:
        t = tensors[i]
        host[offsets[i]: offsets[i] + t.numel() * t.element_size()].view(t.dtype).view(t.shape).copy_(t)
    moved = host.to(device)
    out = []
    for i, t in enumerate(tensors):
        if i in offsets:
            out.append(moved[offsets[i]: offsets[i] + t.numel() * t.element_size()].view(t.dtype).view(t.shape))
        else:
            out.append(t.to(device))
    return out
