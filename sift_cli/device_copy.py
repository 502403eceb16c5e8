"""Many small host tensors moved to a GPU in one copy (a prompt's bit vectors and block table are a dozen
tensors of a few bytes to a few megabytes; one pageable copy each costs tens of microseconds of host time).

The tensors are packed into one pinned staging buffer per device, kept for the process and grown when too small
(allocating pinned memory costs milliseconds), and travel in one asynchronous copy. Before the buffer is
rewritten, the host waits for the previous copy out of it (long finished in practice)."""

from __future__ import annotations

import torch

_ALIGN = 16
_STAGING: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}


def _staging(device: torch.device, nbytes: int) -> torch.Tensor:
    index = device.index if device.index is not None else torch.cuda.current_device()
    buf, done = _STAGING.get(index, (None, None))
    if done is not None:
        done.synchronize()  # the previous copy out of the buffer has finished
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(max(nbytes, 2 * (buf.numel() if buf is not None else 0), 1 << 16), dtype=torch.uint8,
                          pin_memory=True)
        _STAGING[index] = (buf, None)
    return buf


def to_device(tensors: list[torch.Tensor], device) -> list[torch.Tensor]:
    """`tensors` on `device`, same dtypes and shapes (contiguous). To a CUDA device, host tensors travel packed in
    one pinned buffer and one asynchronous copy, and come back as views of it; elsewhere each is moved alone."""
    device = torch.device(device)
    if device.type != "cuda" or not any(t.device.type == "cpu" for t in tensors):
        return [t.to(device) for t in tensors]
    sizes = [t.numel() * t.element_size() if t.device.type == "cpu" else 0 for t in tensors]
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // _ALIGN) * _ALIGN
    total = max(total, _ALIGN)
    host = _staging(device, total)
    for t, off, n in zip(tensors, offsets, sizes):
        if t.device.type == "cpu":
            host[off: off + n].view(t.dtype).view(t.shape).copy_(t)
    moved = torch.empty(total, dtype=torch.uint8, device=device)
    moved.copy_(host[:total], non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(device))
    _STAGING[device.index if device.index is not None else torch.cuda.current_device()] = (host, done)
    return [moved[off: off + n].view(t.dtype).view(t.shape) if t.device.type == "cpu" else t.to(device)
            for t, off, n in zip(tensors, offsets, sizes)]
