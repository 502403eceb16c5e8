"""How `sift bench prefill` times a forward: attention stand-ins (a free one, for the time without attention;
SDPA over expanded K/V, for when cuDNN refuses the GQA call), the SDPA pin, and wall-clock runs from an idle
device."""

from __future__ import annotations

import contextlib
import platform
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...attention.swap import swapped_attention
from ...prefill.run import sync_device

NOATTN = "sift_bench_noattn"
DENSE_EXPANDED = "sift_bench_dense_kv_expanded"


def _noattn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    return query.transpose(1, 2), None  # [B, L, H, D]: free, same shape as attention's output


def _dense_expanded(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=query.shape[2] > 1, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


_STAND_INS = {NOATTN: _noattn, DENSE_EXPANDED: _dense_expanded}


def stand_in(model, name: str | None):
    """The model's attention replaced by the stand-in `name` inside the block (None: left as it is)."""
    return swapped_attention(model, name, _STAND_INS[name]) if name else contextlib.nullcontext()


def sdpa_pin(device, kernel: str):
    if torch.device(device).type != "cuda" or kernel == "default":
        return contextlib.nullcontext()
    return sdpa_kernel([{"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[kernel]])


def timed(fn, device, repeat: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    sync_device(device)
    out = []
    for _ in range(repeat):
        sync_device(device)
        t0 = time.perf_counter()
        fn()
        sync_device(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def device_name(dev) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def interleaved(fns: dict, device, repeat: int, warmup: int) -> dict[str, list[float]]:
    """Wall-clock ms of each of `fns`, run by run in turn (after `warmup` rounds), so a drift of the device's
    speed touches them alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            out[name] += timed(fn, device, 1, 0)
    return out
