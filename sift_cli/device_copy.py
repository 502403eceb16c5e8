"""Many small host tensors moved to a GPU in one copy (a prompt's bit vectors and block table are fifteen
tensors, most of a few bytes: one copy each costs tens of microseconds of host time)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import torch

_ALIGN = 16
SMALL = 1 << 16  # bytes: tensors up to this size travel packed; larger ones (long prompts' bit blobs) alone


def _bytes(t: torch.Tensor) -> np.ndarray | None:
    """The tensor's bytes as a flat numpy array, or None where numpy has no such dtype (bf16)."""
    try:
        return t.detach().contiguous().numpy().reshape(-1).view(np.uint8)
    except (TypeError, RuntimeError):
        return None


def to_device(tensors: list[torch.Tensor], device) -> list[torch.Tensor]:
    """`tensors` on `device`, same dtypes and shapes. To a CUDA device, the small host tensors travel packed in
    one buffer and one copy and come back as (contiguous) views of it; every other tensor is moved alone."""
    device = torch.device(device)
    if device.type != "cuda":
        return [t.to(device) for t in tensors]
    packed: dict[int, tuple[int, np.ndarray]] = {}
    total = 0
    for i, t in enumerate(tensors):
        if t.device.type == "cpu" and 0 < t.numel() * t.element_size() <= SMALL:
            raw = _bytes(t)
            if raw is not None:
                packed[i] = (total, raw)
                total += -(-raw.size // _ALIGN) * _ALIGN
    if len(packed) < 2:
        return [t.to(device) for t in tensors]
    host = np.empty(total, dtype=np.uint8)
    for off, raw in packed.values():
        host[off: off + raw.size] = raw
    moved = torch.from_numpy(host).to(device)
    out = []
    for i, t in enumerate(tensors):
        if i in packed:
            off, raw = packed[i]
            view = moved[off: off + raw.size].view(t.dtype)
            out.append(view if t.dim() == 1 else view.view(t.shape))
        else:
            out.append(t.to(device))
    return out


class DeviceTensors:
    """For a dataclass whose tensor fields, named in TENSORS, move to a device together (one copy, `to_device`)."""

    TENSORS: ClassVar[tuple[str, ...]] = ()

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, k) for k in self.TENSORS]

    def with_tensors(self, tensors: list[torch.Tensor]):
        """The same object with `tensors` (in TENSORS order) in place of its own, e.g. moved to a device."""
        return dataclasses.replace(self, **dict(zip(self.TENSORS, tensors)))

    def to(self, device):
        device = torch.device(device)
        tensors = self.tensors()
        if all(t.device == device for t in tensors):
            return self
        return self.with_tensors(to_device(tensors, device))
