"""Which attention backend runs: one by name, or `auto`'s choice for the device."""

from __future__ import annotations

import torch

from ..errors import SiftError
from .base import AttentionBackend
from .cuda import CudaBackend
from .flex import FlexBackend
from .gather import GatherBackend
from .reference import ReferenceBackend

BACKENDS = ("auto", "gather", "reference", "flex", "cuda")


def _hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def _cupy_ok() -> bool:
    try:
        import cupy  # noqa: F401
        return True
    except Exception:
        return False


CUDA_HEAD_DIMS = (64, 128)


def _cuda_refusal(features) -> str | None:
    """Why the cuda kernel cannot compute this model's attention (None: it can)."""
    if features is not None and features.head_dim not in CUDA_HEAD_DIMS:
        return f"head_dim {features.head_dim} (the kernel has 64 and 128)"
    return None


def get_backend(name: str, device: torch.device, features=None) -> AttentionBackend:
    """A backend by name. `auto` is the only choice that may pick among them: cuda on a Hopper GPU with CuPy,
    else flex on a GPU, else gather (the CPU path whose cost follows the listed blocks). `reference` computes
    every score and masks: it is for checking, not for speed.

    features: the model's `ModelFeatures`, when known. The cuda kernel has head_dim 64 and 128: `cuda` is refused
    for another, naming the model type, and `auto` takes flex (exact for every supported feature). Windows,
    soft-capping and sinks run on the kernel's variants."""
    why_not_cuda = _cuda_refusal(features)
    if name == "auto":
        if _hopper(device) and _cupy_ok() and why_not_cuda is None:
            name = "cuda"
        else:
            name = "flex" if device.type == "cuda" else "gather"
    if name == "gather":
        return GatherBackend()
    if name == "reference":
        return ReferenceBackend()
    if name == "flex":
        if device.type != "cuda":
            raise SiftError("--backend flex needs a CUDA GPU here; use --backend reference on CPU")
        return FlexBackend()
    if name == "cuda":
        if device.type != "cuda":
            raise SiftError("--backend cuda needs a CUDA GPU; use --backend reference on CPU")
        if why_not_cuda is not None:
            raise SiftError(f"--backend cuda: model type {features.model_type} has {why_not_cuda}; use --backend "
                            "flex (or auto)")
        return CudaBackend()
    raise SiftError(f"--backend {name}: expected one of {', '.join(BACKENDS)}")
