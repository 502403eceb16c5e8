"""device_copy.to_device: many host tensors to a device in one copy, each back with its dtype, shape and values."""

import pytest
import torch

from sift_cli.device_copy import to_device


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 255, (1001,), generator=g, dtype=torch.uint8),
            torch.randint(-9, 9, (3, 5), generator=g, dtype=torch.int32),
            torch.empty(0, dtype=torch.int64),
            torch.empty(0, 3, dtype=torch.int32),
            torch.randint(-2**40, 2**40, (7,), generator=g, dtype=torch.int64),
            torch.randn(4, 6, generator=g).t(),  # not contiguous
            torch.tensor(True),
            torch.randn(3, generator=g, dtype=torch.float64),
            torch.randn(5, generator=g).to(torch.bfloat16)]


def _same(moved, originals, device):
    for m, t in zip(moved, originals):
        assert m.device.type == torch.device(device).type and m.dtype == t.dtype and m.shape == t.shape
        assert torch.equal(m.cpu(), t)


def test_cpu_is_a_plain_move():
    ts = _tensors()
    _same(to_device(ts, "cpu"), ts, "cpu")


@pytest.mark.gpu
def test_one_copy_to_the_gpu_keeps_every_tensor():
    ts = _tensors()
    already = torch.arange(5, device="cuda")
    moved = to_device(ts + [already], "cuda")
    torch.cuda.synchronize()
    _same(moved[:-1], ts, "cuda")
    assert moved[-1] is already or torch.equal(moved[-1], already)
    assert all(m.data_ptr() % 16 == 0 for m in moved[:-1] if m.numel())
    big = torch.arange(40000, dtype=torch.int32)  # over device_copy.SMALL: moved alone
    _same(to_device([big, ts[1]], "cuda"), [big, ts[1]], "cuda")
