"""Host side of the bundled CUDA kernels (`kernels/*.cu`): find the sources, compile them at run time through CuPy
(NVRTC) for sm_90a, cache the compiled modules, encode TMA descriptors and launch on torch's current stream.

Nothing here falls back silently: when a kernel cannot run (no CuPy, no sm_90 GPU) a SiftError says why. Sources
are found in $SIFT_KERNELS_DIR, next to the package in a source checkout (<repo>/kernels), or inside the installed
package (sift_cli/_kernels). Compiled modules are cached per (source text, options) in this process, and by CuPy
on disk. The kernels themselves: `attention.py` (sparse attention forward) and `decode.py` (bits → block lists).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import SiftError

_PACKAGE = Path(__file__).resolve().parent.parent  # sift_cli/


# ----------------------------------------------------------------------------------------------------------
# Sources, CuPy, compilation
# ----------------------------------------------------------------------------------------------------------

def kernel_dir() -> Path:
    candidates = []
    if os.environ.get("SIFT_KERNELS_DIR"):
        candidates.append(Path(os.environ["SIFT_KERNELS_DIR"]))
    candidates += [_PACKAGE.parent / "kernels", _PACKAGE / "_kernels"]
    for c in candidates:
        if (c / "sparse_attn_fwd.cu").is_file():
            return c
    raise SiftError("CUDA kernel sources not found (looked in " + ", ".join(str(c) for c in candidates)
                    + "); reinstall sift-cli or set SIFT_KERNELS_DIR")


@functools.lru_cache(maxsize=None)
def kernel_source(name: str) -> str:
    return (kernel_dir() / name).read_text()


def _cupy():
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        raise SiftError(f"the cuda backend needs CuPy (pip install 'sift-cli[gpu]'): {exc}") from None
    return cupy


def check_device(t: torch.Tensor, what: str = "input") -> None:
    if not t.is_cuda:
        raise SiftError(f"the cuda backend needs {what} on a CUDA device, got {t.device}")
    major, minor = torch.cuda.get_device_capability(t.device)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(t.device)
        raise SiftError(f"the cuda backend's kernels are built for Hopper (sm_90a); {name} is sm_{major}{minor}. "
                        "Use --backend flex or reference")


_MODULES: dict = {}


def compiled_module(source_name: str, defines: tuple[tuple[str, int], ...], device_index: int):
    key = (source_name, defines, device_index)
    mod = _MODULES.get(key)
    if mod is None:
        cp = _cupy()
        options = ("-arch=sm_90a", "-std=c++17") + tuple(f"-D{k}={v}" for k, v in defines)
        try:
            with cp.cuda.Device(device_index):
                mod = cp.RawModule(code=kernel_source(source_name), options=options)
                mod.compile()
        except Exception as exc:
            raise SiftError(f"compiling kernels/{source_name} ({' '.join(options)}) failed: {exc}") from None
        _MODULES[key] = mod
    return mod


_STREAMS: dict = {}


def _stream(cp, device: torch.device):
    ptr = torch.cuda.current_stream(device).cuda_stream
    st = _STREAMS.get((device.index, ptr))
    if st is None:
        st = _STREAMS[(device.index, ptr)] = cp.cuda.ExternalStream(ptr, device.index)
    return st


# ----------------------------------------------------------------------------------------------------------
# TMA descriptors (cuTensorMapEncodeTiled through ctypes on the driver library)
# ----------------------------------------------------------------------------------------------------------

_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
_CU_TENSOR_MAP_SWIZZLE_128B = 3
_CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3


@functools.lru_cache(maxsize=None)
def _libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise SiftError(f"cannot load the CUDA driver library libcuda.so.1: {exc}") from None
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    launch = lib.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def tensor_map_bf16_3d(t: torch.Tensor, box_rows: int) -> np.ndarray:
    """CUtensorMap (128 bytes, as a size-1 numpy array) for a bf16 [A, R, D] view with unit stride on D.

    TMA dims (innermost first): D, R, A; box {64, box_rows, 1}; 128-byte swizzle; out-of-bounds rows read 0.
    """
    a, r, d = t.shape
    sa, sr, sd = t.stride()
    if sd != 1 or (sr * 2) % 16 or (sa * 2) % 16 or t.data_ptr() % 16:
        raise SiftError("internal: tensor not TMA-compatible (needs unit stride on the head dim, 16-byte strides)")
    buf = (ctypes.c_uint8 * 256)()
    addr = (ctypes.addressof(buf) + 63) & ~63  # CUtensorMap is 64-byte aligned
    dims = (ctypes.c_uint64 * 3)(d, r, a)
    strides = (ctypes.c_uint64 * 2)(sr * 2, sa * 2)
    box = (ctypes.c_uint32 * 3)(64, box_rows, 1)
    elem = (ctypes.c_uint32 * 3)(1, 1, 1)
    rc = _libcuda().cuTensorMapEncodeTiled(ctypes.c_void_p(addr), _CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                                           ctypes.c_void_p(t.data_ptr()), dims, strides, box, elem, 0,
                                           _CU_TENSOR_MAP_SWIZZLE_128B, _CU_TENSOR_MAP_L2_PROMOTION_L2_256B, 0)
    if rc != 0:
        raise SiftError(f"cuTensorMapEncodeTiled failed with CUresult {rc} for shape {tuple(t.shape)}")
    out = np.zeros(1, dtype=np.dtype((np.void, 128)))
    ctypes.memmove(out.ctypes.data, addr, 128)
    return out


# ----------------------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------------------

def launch(kern, grid, block, args, smem, device):
    """Launch on torch's current stream: through CuPy (TMA maps go by value as 128-byte numpy arrays of size 1);
    if this CuPy cannot pass such an argument, through cuLaunchKernel on the same CUfunction."""
    cp = _cupy()
    with cp.cuda.Device(device.index):
        try:
            with _stream(cp, device):
                kern(grid, block, args, shared_mem=smem)
            return
        except TypeError:
            pass
        _launch_driver(kern, grid, block, args, smem, device)


def _launch_driver(kern, grid, block, args, smem, device):
    holders = []
    for a in args:
        if isinstance(a, np.ndarray):
            holders.append(a)
        elif isinstance(a, np.int32):
            holders.append(ctypes.c_int32(int(a)))
        elif isinstance(a, np.float32):
            holders.append(ctypes.c_float(float(a)))
        elif isinstance(a, int):
            holders.append(ctypes.c_uint64(a))
        else:
            raise SiftError(f"internal: cannot pass kernel argument of type {type(a).__name__}")
    ptrs = (ctypes.c_void_p * len(holders))(*[
        h.ctypes.data if isinstance(h, np.ndarray) else ctypes.addressof(h) for h in holders])
    func = kern.kernel.ptr if hasattr(kern, "kernel") else kern.ptr
    stream = torch.cuda.current_stream(device).cuda_stream
    rc = _libcuda().cuLaunchKernel(ctypes.c_void_p(func), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                   smem, ctypes.c_void_p(stream), ptrs, None)
    if rc != 0:
        raise SiftError(f"cuLaunchKernel failed with CUresult {rc}")
