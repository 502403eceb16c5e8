"""device_copy: many host tensors to a device in one copy (to_device, and StagedCopy's pinned buffer and its
layout), each back with its dtype, shape and values."""

import numpy as np
import pytest
import torch

from sift_cli.device_copy import StagedCopy, StagedLayout, to_device
from sift_cli.errors import SiftError


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


def _awkward():
    """Staged tensors of awkward sizes: empty, one byte, a 0-d bool, int64, bf16, not contiguous."""
    g = torch.Generator().manual_seed(1)
    return [torch.empty(0, dtype=torch.int64),
            torch.tensor([7], dtype=torch.uint8),
            torch.tensor(True),
            torch.randint(-2**40, 2**40, (3,), generator=g, dtype=torch.int64),
            torch.randn(5, generator=g).to(torch.bfloat16),
            torch.randint(0, 2, (3, 3), generator=g, dtype=torch.bool),
            torch.randn(4, 6, generator=g).t(),
            torch.empty(0, 3, dtype=torch.int32),
            torch.randint(0, 255, (17,), generator=g, dtype=torch.uint8)]


def _changed(ts, k):
    """The same dtypes and shapes, other values."""
    return [~t if t.dtype == torch.bool else t + k for t in ts]


def test_staged_layout_aligns_packs_and_views_back_on_the_host():
    ts = _awkward()
    layout = StagedLayout.of(ts)
    assert all(off % 16 == 0 for off in layout.offsets) and layout.size % 16 == 0
    assert layout.nbytes[:3] == (0, 1, 1) and layout.size == sum(-(-n // 16) * 16 for n in layout.nbytes)
    buf = np.full(layout.size, 0xAB, dtype=np.uint8)
    layout.pack(ts, buf)
    _same(layout.views(torch.from_numpy(buf)), ts, "cpu")
    again = _changed(ts, 1)
    layout.pack(again, buf)  # restaged: the same views read the new values
    _same(layout.views(torch.from_numpy(buf)), again, "cpu")


def test_staged_layout_refuses_other_tensors_in_one_line():
    ts = _awkward()
    layout = StagedLayout.of(ts)
    buf = np.zeros(layout.size, dtype=np.uint8)
    for bad in (ts[:-1],
                ts[:3] + [ts[3].to(torch.int32)] + ts[4:],
                ts[:8] + [torch.zeros(18, dtype=torch.uint8)]):
        with pytest.raises(SiftError) as e:
            layout.pack(bad, buf)
        assert "\n" not in str(e.value)


def test_staged_copy_needs_a_cuda_device():
    with pytest.raises(SiftError):
        StagedCopy(_awkward(), "cpu")


@pytest.mark.gpu
def test_staged_copy_round_trip_and_captured_copy_reads_restaged_values():
    ts = _awkward()
    staged = StagedCopy(ts, "cuda")
    assert staged.host.is_pinned() and all(v.data_ptr() % 16 == 0 for v in staged.views if v.numel())
    staged.copy()
    torch.cuda.synchronize()
    _same(staged.views, ts, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        staged.copy()
    torch.cuda.synchronize()
    for k in (1, 2):
        again = _changed(ts, k)
        staged.stage(again)
        graph.replay()
        torch.cuda.synchronize()
        _same(staged.views, again, "cuda")
