"""The Hopper backend: kernels/sparse_attn_fwd.cu through sift_cli.cuda (CuPy/NVRTC, sm_90a)."""

from __future__ import annotations

import torch

from ..cuda.attention import sparse_attention_forward
from ..errors import SiftError
from .base import BlockLists


class CudaBackend:
    """Block-sparse attention with the bundled TMA + WGMMA kernel. bf16 only; no silent fallback."""

    name = "cuda"

    def __init__(self, pingpong: bool = True):
        self.pingpong = pingpong

    @staticmethod
    def available(device: torch.device | str | None = None) -> tuple[bool, str]:
        """(usable, reason): a CUDA sm_90 device and an importable CuPy."""
        if not torch.cuda.is_available():
            return False, "no CUDA device"
        dev = torch.device(device) if device is not None else torch.device("cuda")
        cap = torch.cuda.get_device_capability(dev)
        if cap != (9, 0):
            return False, f"device is sm_{cap[0]}{cap[1]}, the kernels need sm_90"
        try:
            import cupy  # noqa: F401
        except Exception as exc:  # pragma: no cover - depends on the machine
            return False, f"CuPy is not importable: {exc}"
        return True, ""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists, scale: float,
                return_lse: bool = False):
        if q.dtype != torch.bfloat16:
            raise SiftError(f"the cuda backend computes in bf16, got {q.dtype}; load the model in bf16")
        return sparse_attention_forward(q, k, v, blocks, scale, return_lse, pingpong=self.pingpong)
