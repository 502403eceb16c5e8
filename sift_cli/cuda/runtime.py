"""Host side of the bundled CUDA kernels (`kernels/*.cu`): find the sources, compile them at run time through CuPy
(NVRTC) for sm_90a, cache the compiled modules, build TMA descriptors and launch on torch's current stream.

Launches go through the driver's cuLaunchKernel with arguments packed once (`PackedLaunch`): a call that only
changes a few pointers costs a few microseconds of host time. TMA descriptors are encoded once per shape and
strides (`TensorMapTemplate`); a new tensor address is patched into the 128-byte descriptor when the driver is
seen to store it verbatim (checked once per process by encoding at three addresses), else encoded again.

Nothing here falls back silently: when a kernel cannot run (no CuPy, no sm_90 GPU) a SiftError says why. Sources
are found in $SIFT_KERNELS_DIR, next to the package in a source checkout (<repo>/kernels), or inside the installed
package (sift_cli/_kernels). Compiled modules are cached per (source text, options) in this process, and by CuPy
on disk.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path

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


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([\w.]+)"[^\n]*$', re.M)


@functools.lru_cache(maxsize=None)
def kernel_source(name: str) -> str:
    """The text of kernels/`name`, its includes inlined (`inline_includes`)."""
    return inline_includes((kernel_dir() / name).read_text(), name)


def inline_includes(text: str, name: str = "source") -> str:
    """`text` with its `#include "x.cuh"` lines (siblings in the kernel directory) replaced by their text, once
    each: NVRTC compiles one self-contained string, and CuPy's on-disk cache, keyed by that string, sees a change of
    a shared header too. name: what `text` is, for errors."""
    seen: set[str] = {name}

    def inline(m: re.Match) -> str:
        inc = m.group(1)
        if inc in seen:
            return ""
        seen.add(inc)
        if not (kernel_dir() / inc).is_file():
            raise SiftError(f"{name} includes {inc}, which is not in {kernel_dir()}")
        return _INCLUDE.sub(inline, (kernel_dir() / inc).read_text()).replace("#pragma once\n", "")

    return _INCLUDE.sub(inline, text)


def _cupy():
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        raise SiftError(f"the cuda backend needs CuPy (pip install 'sift-cli[gpu]'): {exc}") from None
    return cupy


def check_device(t: torch.Tensor, what: str = "input") -> None:
    if not t.is_cuda:
        raise SiftError(f"the cuda backend needs {what} on a CUDA device, got {t.device}")
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    major, minor = _capability(index)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(t.device)
        raise SiftError(f"the cuda backend's kernels are built for Hopper (sm_90a); {name} is sm_{major}{minor}. "
                        "Use --backend flex or reference")


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    """The device's compute capability, asked once: each prompt's preparation checks its tensors' device twice,
    and torch's getter builds the device's whole property record every time."""
    return torch.cuda.get_device_capability(device_index)


_MODULES: dict = {}


def compiled_module(source_name: str, defines: tuple[tuple[str, int], ...], device_index: int):
    """kernels/`source_name` compiled with `defines`, once per process."""
    key = (source_name, defines, device_index)
    mod = _MODULES.get(key)
    if mod is None:
        mod = _MODULES[key] = compile_source(kernel_source(source_name), defines, device_index,
                                             f"kernels/{source_name}")
    return mod


def compile_source(text: str, defines: tuple[tuple[str, int], ...], device_index: int, what: str):
    """A CuPy RawModule of `text` (includes inlined already) for sm_90a with `defines`; what: for errors."""
    cp = _cupy()
    options = ("-arch=sm_90a", "-std=c++17") + tuple(f"-D{k}={v}" for k, v in defines)
    try:
        with cp.cuda.Device(device_index):
            mod = cp.RawModule(code=text, options=options)
            mod.compile()
    except Exception as exc:
        raise SiftError(f"compiling {what} ({' '.join(options)}) failed: {exc}") from None
    return mod


def function_ptr(module, name: str, dynamic_smem: int = 0) -> int:
    """The CUfunction of `name`, its dynamic shared-memory limit raised to `dynamic_smem`."""
    kern = module.get_function(name)
    if dynamic_smem and kern.max_dynamic_shared_size_bytes < dynamic_smem:
        kern.max_dynamic_shared_size_bytes = dynamic_smem
        if hasattr(kern, "preferred_shared_memory_carveout"):  # all of the SM's memory as shared: room for 2 CTAs
            kern.preferred_shared_memory_carveout = 100
    return kern.kernel.ptr if hasattr(kern, "kernel") else kern.ptr


def resident_ctas(func: int, threads: int, dynamic_smem: int) -> int:
    """How many CTAs of `func` (a CUfunction) the driver can keep on one SM at once."""
    n = ctypes.c_int(0)
    rc = _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(func), threads,
                                                                 ctypes.c_size_t(dynamic_smem))
    if rc != 0:
        raise SiftError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed (CUresult {rc})")
    return n.value


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size


# ----------------------------------------------------------------------------------------------------------
# The driver: TMA descriptors and launches
# ----------------------------------------------------------------------------------------------------------

_BF16 = 9  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3


@functools.lru_cache(maxsize=None)
def _libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise SiftError(f"cannot load the CUDA driver library libcuda.so.1: {exc}") from None
    enc = lib.cuTensorMapEncodeTiled
    enc.restype = ctypes.c_int
    enc.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                    ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                    ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    launch = lib.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


TensorMap = ctypes.c_uint8 * 128  # CUtensorMap: 128 opaque bytes, passed to the kernel by value


def encode_tensor_map(ptr: int, shape: tuple[int, int, int], strides: tuple[int, int, int], box_rows: int,
                      out: ctypes.Array | None = None) -> ctypes.Array:
    """CUtensorMap for a bf16 [A, R, D] view at `ptr` (element strides, unit stride on D): box {64, box_rows, 1},
    128-byte swizzle, rows past R read as zero."""
    a, r, d = shape
    sa, sr, sd = strides
    if sd != 1 or (sr * 2) % 16 or (sa * 2) % 16 or ptr % 16:
        raise SiftError("internal: tensor not TMA-compatible (needs unit stride on the head dim, 16-byte strides)")
    buf = (ctypes.c_uint8 * 192)()
    addr = (ctypes.addressof(buf) + 63) & ~63  # the encoder wants a 64-byte aligned CUtensorMap
    dims = (ctypes.c_uint64 * 3)(d, r, a)
    byte_strides = (ctypes.c_uint64 * 2)(sr * 2, sa * 2)
    box = (ctypes.c_uint32 * 3)(64, box_rows, 1)
    elem = (ctypes.c_uint32 * 3)(1, 1, 1)
    rc = _libcuda().cuTensorMapEncodeTiled(ctypes.c_void_p(addr), _BF16, 3, ctypes.c_void_p(ptr), dims,
                                           byte_strides, box, elem, 0, _SWIZZLE_128B, _L2_PROMOTION_256B, 0)
    if rc != 0:
        raise SiftError(f"cuTensorMapEncodeTiled failed with CUresult {rc} for shape {shape}")
    out = out if out is not None else TensorMap()
    ctypes.memmove(out, addr, 128)
    return out


@functools.lru_cache(maxsize=None)
def address_patchable(device_index: int) -> bool:
    """Does the driver store a CUtensorMap's global address verbatim in its first 8 bytes? Checked by encoding the
    same view at three addresses: only word 0 may differ, and it must equal the address."""
    base = torch.empty(1 << 16, dtype=torch.bfloat16, device=torch.device("cuda", device_index))
    p0 = base.data_ptr()
    words = []
    for off in (0, 4096, 65536):
        m = encode_tensor_map(p0 + off, (2, 64, 64), (64 * 64, 64, 1), 64)
        words.append([ctypes.c_uint64.from_buffer(m, 8 * i).value for i in range(16)])
    same_rest = all(w[1:] == words[0][1:] for w in words)
    return same_rest and all(w[0] == p0 + off for w, off in zip(words, (0, 4096, 65536)))


_ENCODED: dict = {}  # (device, shape, strides, box rows) → a descriptor's bytes, where addresses are patchable


class TensorMapTemplate:
    """A TMA descriptor for views of one shape and strides; `point(ptr)` re-targets it at another tensor. Where
    the driver stores the address verbatim, a descriptor once encoded is copied and re-targeted instead of encoded
    again (K and V of one layer share a shape; so do the layers of prompts of one length)."""

    def __init__(self, t: torch.Tensor, box_rows: int):
        self.key = (tuple(t.shape), tuple(t.stride()), box_rows)
        self.patch = address_patchable(t.device.index)
        cache_key = (t.device.index, *self.key)
        encoded = _ENCODED.get(cache_key) if self.patch else None
        if encoded is None:
            self.map = encode_tensor_map(t.data_ptr(), *self.key)
            if self.patch:
                if len(_ENCODED) >= 256:
                    _ENCODED.clear()
                _ENCODED[cache_key] = bytes(self.map)
        else:
            self.map = TensorMap.from_buffer_copy(encoded)
        self._word0 = ctypes.c_uint64.from_buffer(self.map, 0)
        if encoded is not None:
            self._word0.value = t.data_ptr()

    def matches(self, t: torch.Tensor) -> bool:
        return (tuple(t.shape), tuple(t.stride())) == self.key[:2]

    def point(self, ptr: int) -> None:
        if self.patch:
            self._word0.value = ptr
        else:
            encode_tensor_map(ptr, *self.key, out=self.map)


class PackedLaunch:
    """One kernel's launch with its arguments packed once: `set(name, value)` changes one, `__call__` launches.

    args: (name, kind, value) with kind p (pointer), i (int32), l (int64), f (float32) or map (a TensorMap)."""

    _CTYPES = {"p": ctypes.c_uint64, "i": ctypes.c_int32, "l": ctypes.c_int64, "f": ctypes.c_float}

    def __init__(self, func: int, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                 args: list[tuple[str, str, object]]):
        self.func, self.grid, self.block, self.smem = ctypes.c_void_p(func), grid, block, smem
        self.values = {}
        holders = []
        for name, kind, value in args:
            holder = value if kind == "map" else self._CTYPES[kind](value)
            self.values[name] = holder
            holders.append(holder)
        self._holders = holders
        self._params = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        self._head = (self.func, *grid, *block, smem)  # cuLaunchKernel's arguments before the stream

    def set(self, name: str, value) -> None:
        self.values[name].value = value

    def __call__(self, stream: int, func: int | None = None) -> None:
        """Launch on `stream`; func: another compiled variant of the same kernel (same arguments) instead."""
        head = self._head if func is None else (ctypes.c_void_p(func),) + self._head[1:]
        rc = _libcuda().cuLaunchKernel(*head, stream, self._params, None)
        if rc != 0:
            raise SiftError(f"cuLaunchKernel failed with CUresult {rc}")


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """The handle of torch's current stream on `device` (a side stream or a graph's capture stream included).
    torch's own getter of the raw handle took 0.1 µs a call on the H200 where `torch.cuda.current_stream(device)
    .cuda_stream` took 5 µs, and a sparse prefill asks once per layer; the public form where torch lacks it."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def launch(func: int, grid, block, smem: int, args: list[tuple[str, str, object]], device: torch.device) -> None:
    """A one-off launch on torch's current stream."""
    PackedLaunch(func, grid, block, smem, args)(stream_handle(device))
