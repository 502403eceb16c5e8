"""Many small host tensors moved to a GPU in one copy (a prompt's bit vectors and block table are fifteen
tensors, most of a few bytes: one copy each costs tens of microseconds of host time): `to_device` once, or
`StagedCopy` through a pinned buffer, restaged per prompt, whose copy a CUDA graph captures."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import torch

from .errors import SiftError

_ALIGN = 16
SMALL = 1 << 16  # bytes: tensors up to this size travel packed; larger ones (long prompts' bit blobs) alone


def _bytes(t: torch.Tensor) -> np.ndarray | None:
    """The tensor's bytes as a flat numpy array, or None where numpy has no such dtype (bf16)."""
    try:
        if t.dim() == 1 and t.is_contiguous() and not t.requires_grad:  # the common case, at a third of the cost
            return t.numpy().view(np.uint8)
        return t.detach().contiguous().numpy().reshape(-1).view(np.uint8)
    except (TypeError, RuntimeError):
        return None


def to_device(tensors: list[torch.Tensor], device) -> list[torch.Tensor]:
    """`tensors` on `device`, same dtypes and shapes. To a CUDA device, the small host tensors travel packed in
    one buffer and one copy (`StagedLayout`) and come back as (contiguous) views of it; every other tensor is moved
    alone."""
    device = torch.device(device)
    if device.type != "cuda":
        return [t.to(device) for t in tensors]
    raws: dict[int, np.ndarray] = {}
    for i, t in enumerate(tensors):
        if t.device.type == "cpu" and 0 < t.numel() * t.element_size() <= SMALL:
            raw = _bytes(t)
            if raw is not None:
                raws[i] = raw
    if len(raws) < 2:
        return [t.to(device) for t in tensors]
    layout = StagedLayout.of([tensors[i] for i in raws])
    host = np.empty(layout.size, dtype=np.uint8)
    for off, raw in zip(layout.offsets, raws.values()):
        host[off: off + raw.size] = raw
    moved = iter(layout.views(torch.from_numpy(host).to(device)))
    return [next(moved) if i in raws else t.to(device) for i, t in enumerate(tensors)]


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


@dataclasses.dataclass(frozen=True)
class StagedLayout:
    """Where each of a list of tensors lies in one byte buffer (16-byte aligned, in order): `pack` writes host
    tensors' bytes into a buffer, `views` reads a buffer of the same layout (on any device) back as the tensors."""

    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    nbytes: tuple[int, ...]
    size: int  # bytes of the whole buffer

    @staticmethod
    def of(tensors: list[torch.Tensor]) -> "StagedLayout":
        offsets, nbytes, total = [], [], 0
        for t in tensors:
            n = t.numel() * t.element_size()
            offsets.append(total)
            nbytes.append(n)
            total += -(-n // _ALIGN) * _ALIGN
        return StagedLayout(tuple(t.dtype for t in tensors), tuple(t.shape for t in tensors), tuple(offsets),
                            tuple(nbytes), total)

    def check(self, tensors: list[torch.Tensor]) -> None:
        """SiftError unless `tensors` are host tensors of this layout's dtypes and shapes, in its order."""
        if len(tensors) != len(self.dtypes):
            raise SiftError(f"internal: {len(tensors)} tensors staged into a layout of {len(self.dtypes)} — stage "
                            "the tensors the copy was built from")
        for i, (t, dtype, shape) in enumerate(zip(tensors, self.dtypes, self.shapes)):
            if t.dtype != dtype or t.shape != shape or t.device.type != "cpu":
                raise SiftError(f"internal: staged tensor {i} is {t.dtype} {tuple(t.shape)} on {t.device}, the "
                                f"layout holds {dtype} {tuple(shape)} on the host — stage the tensors the copy "
                                "was built from")

    def pack(self, tensors: list[torch.Tensor], out: np.ndarray) -> None:
        """Write `tensors` (checked against the layout) into `out`, a uint8 array of `size` bytes."""
        self.check(tensors)
        for t, off, n in zip(tensors, self.offsets, self.nbytes):
            if n:
                raw = _bytes(t)
                if raw is None:
                    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
                out[off: off + n] = raw

    def views(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """The tensors as views of `buf`, a uint8 tensor of `size` bytes laid out by `pack`."""
        out = []
        for dtype, shape, off, n in zip(self.dtypes, self.shapes, self.offsets, self.nbytes):
            view = buf[off: off + n].view(dtype)
            out.append(view if len(shape) == 1 else view.view(shape))
        return out


class StagedCopy:
    """Host tensors moved to a CUDA device by one copy that a CUDA graph can capture: their bytes lie in one
    pinned host buffer (`stage` writes new tensors of the same dtypes and shapes there, host work only), and
    `copy()` enqueues one asynchronous copy of it, on the current stream, into one device buffer of the same layout,
    of which `views` are the tensors on the device (same dtypes and shapes). Captured, the copy is a memcpy node
    reading the pinned buffer at each replay, so the buffer must not be restaged with other contents while a copy
    that reads it is in flight (replays run one after another; restaging the same tensors writes the same bytes).
    No size limit: every tensor travels in the one buffer."""

    def __init__(self, tensors: list[torch.Tensor], device):
        device = torch.device(device)
        if device.type != "cuda":
            raise SiftError(f"internal: a staged copy needs a CUDA device, not {device} — use to_device")
        self.layout = StagedLayout.of(tensors)
        self.host = torch.zeros(self.layout.size, dtype=torch.uint8, pin_memory=True)
        self._host_bytes = self.host.numpy()  # shares the pinned memory: staging is numpy copies
        self.device_buf = torch.empty(self.layout.size, dtype=torch.uint8, device=device)
        self.views = self.layout.views(self.device_buf)
        self.stage(tensors)

    def stage(self, tensors: list[torch.Tensor]) -> None:
        self.layout.pack(tensors, self._host_bytes)

    def copy(self) -> None:
        self.device_buf.copy_(self.host, non_blocking=True)
