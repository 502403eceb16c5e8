"""The bundled CUDA kernels (kernels/*.cu): run-time compilation through CuPy (NVRTC), launch on torch's stream.

* `sparse_attention_forward(q, k, v, blocks, scale, return_lse)`: the Hopper (sm_90a) block-sparse attention
  forward of kernels/sparse_attn_fwd.cu (TMA + mbarrier ring + warp-specialised WGMMA).
* `CudaDecoder(bits_on_gpu, block_m, block_n).layer(l)` / `decode_layer_cuda(...)`: the two-pass bit-vector
  decode of kernels/decode.cu, producing exactly the CSR lists of sift_cli.block_lists.decode_layer.

Nothing here falls back silently: when a kernel cannot run (no CuPy, no sm_90 GPU, unsupported shape) a
SiftError says why. Sources are found in $SIFT_KERNELS_DIR, next to the package in a source checkout
(<repo>/kernels), or inside the installed package (sift_cli/_kernels). Compiled modules are cached per
(source text, options) in this process, and by CuPy on disk.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from pathlib import Path

import numpy as np
import torch

from .attention.base import BlockLists
from .errors import SiftError

BLOCK_M = 128
ATTN_THREADS = 384
DEC_THREADS = 128
SCAN_THREADS = 1024
HEAD_DIMS = (64, 128)
BLOCK_NS = (64, 128)


# ----------------------------------------------------------------------------------------------------------
# Sources, CuPy, compilation
# ----------------------------------------------------------------------------------------------------------

def kernel_dir() -> Path:
    candidates = []
    if os.environ.get("SIFT_KERNELS_DIR"):
        candidates.append(Path(os.environ["SIFT_KERNELS_DIR"]))
    here = Path(__file__).resolve().parent
    candidates += [here.parent / "kernels", here / "_kernels"]
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


def _module(source_name: str, defines: tuple[tuple[str, int], ...], device_index: int):
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
# Attention forward
# ----------------------------------------------------------------------------------------------------------

def default_stages(head_dim: int, block_n: int) -> int:
    """Ring depth per configuration (measured on the H200, docs/kernels.md)."""
    return 3 if (head_dim == 128 and block_n == 64) else 2


def attention_smem_bytes(head_dim: int, block_n: int, stages: int) -> int:
    q = BLOCK_M * head_dim * 2
    kv = block_n * head_dim * 2
    return q + 2 * stages * kv + 8 * (2 + 4 * stages) + 1024  # + barriers + slack for 1024-byte alignment


def attention_kernel(head_dim: int, block_n: int, device_index: int, stages: int | None = None,
                     pingpong: bool = True, extra: dict | None = None):
    """(RawKernel, dynamic shared memory bytes) for one configuration, compiled once per process."""
    if head_dim not in HEAD_DIMS:
        raise SiftError(f"the cuda backend supports head_dim 64 and 128, not {head_dim}")
    if block_n not in BLOCK_NS:
        raise SiftError(f"the cuda backend supports KV blocks of 64 and 128, not {block_n}")
    stages = stages or default_stages(head_dim, block_n)
    defines = (("HEAD_DIM", head_dim), ("BLOCK_N", block_n), ("STAGES", stages), ("PINGPONG", int(pingpong)))
    defines += tuple(sorted((extra or {}).items()))
    mod = _module("sparse_attn_fwd.cu", defines, device_index)
    kern = mod.get_function("sift_sparse_attn_fwd")
    smem = attention_smem_bytes(head_dim, block_n, stages)
    if kern.max_dynamic_shared_size_bytes < smem:
        kern.max_dynamic_shared_size_bytes = smem
    return kern, smem


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    ok = t.stride(-1) == 1 and all((s * 2) % 16 == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0
    return t if ok else t.contiguous()


def _launch(kern, grid, block, args, smem, device):
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


def check_block_lists(blocks: BlockLists, H: int, L: int, device: torch.device) -> BlockLists:
    if blocks.block_m != BLOCK_M:
        raise SiftError(f"the cuda backend needs query blocks of {BLOCK_M} rows, the block lists have "
                        f"{blocks.block_m}")
    if blocks.block_n not in BLOCK_NS:
        raise SiftError(f"the cuda backend needs KV blocks of 64 or 128, the block lists have {blocks.block_n}")
    M = -(-L // BLOCK_M)
    if blocks.seq_len != L or tuple(blocks.offsets.shape) != (H, M + 1):
        raise SiftError(f"block lists are for H={blocks.n_heads}, L={blocks.seq_len}; attention has H={H}, L={L}")
    if blocks.offsets.dtype != torch.int32 or blocks.indices.dtype != torch.int32:
        raise SiftError("block list offsets and indices must be int32")
    if blocks.offsets.device != device or blocks.indices.device != device:
        blocks = blocks.to(device)
    if not (blocks.offsets.is_contiguous() and blocks.indices.is_contiguous()):
        blocks = BlockLists(blocks.offsets.contiguous(), blocks.indices.contiguous(), blocks.block_m,
                            blocks.block_n, blocks.seq_len)
    return blocks


def sparse_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists,
                             scale: float, return_lse: bool = False, out: torch.Tensor | None = None,
                             lse: torch.Tensor | None = None, stages: int | None = None, pingpong: bool = True,
                             persistent: bool = False, extra: dict | None = None):
    """Block-sparse causal attention: q [H, L, D], k/v [H_kv, L, D] bf16 → out [H, L, D] bf16 (+ lse [H, L]).

    Row (h, m) of `blocks` lists, in descending order, the KV blocks query block m of head h computes.
    persistent: launch one CTA per SM walking tiles round-robin instead of one CTA per tile (measured no faster
    with static round-robin, so off by default; see docs/kernels.md).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise SiftError(f"{name} must be [heads, seq_len, head_dim], got shape {tuple(t.shape)}")
        if t.dtype != torch.bfloat16:
            raise SiftError(f"the cuda backend computes in bf16; {name} is {t.dtype}")
        check_device(t, name)
    if not (q.device == k.device == v.device):
        raise SiftError("q, k and v must be on the same device")
    H, L, D = q.shape
    H_kv = k.shape[0]
    if tuple(k.shape) != (H_kv, L, D) or tuple(v.shape) != (H_kv, L, D):
        raise SiftError(f"k and v must be [{H_kv}, {L}, {D}], got {tuple(k.shape)} and {tuple(v.shape)}")
    if H_kv == 0 or H % H_kv:
        raise SiftError(f"query heads {H} are not a multiple of KV heads {H_kv}")
    if D not in HEAD_DIMS:
        raise SiftError(f"the cuda backend supports head_dim 64 and 128, not {D}")
    device = q.device
    blocks = check_block_lists(blocks, H, L, device)
    if out is None:
        out = torch.empty(H, L, D, dtype=torch.bfloat16, device=device)
    elif tuple(out.shape) != (H, L, D) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise SiftError("out must be a contiguous bf16 [H, L, D] tensor")
    if return_lse and lse is None:
        lse = torch.empty(H, L, dtype=torch.float32, device=device)
    if L == 0:
        return (out, lse) if return_lse else out
    kern, smem = attention_kernel(D, blocks.block_n, device.index, stages, pingpong, extra)
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    tq = tensor_map_bf16_3d(q, BLOCK_M)
    tk = tensor_map_bf16_3d(k, blocks.block_n)
    tv = tensor_map_bf16_3d(v, blocks.block_n)
    M = -(-L // BLOCK_M)
    lse_ptr = lse.data_ptr() if return_lse else out.data_ptr()
    args = (tq, tk, tv, out.data_ptr(), lse_ptr, blocks.offsets.data_ptr(), blocks.indices.data_ptr(),
            np.int32(L), np.int32(H), np.int32(H // H_kv), np.int32(M), np.float32(scale * math.log2(math.e)),
            np.int32(1 if return_lse else 0))
    tiles = H * M
    grid = min(tiles, _sm_count(device)) if persistent else tiles
    _launch(kern, (grid, 1, 1), (ATTN_THREADS, 1, 1), args, smem, device)
    # keep the views alive until the launch is queued (their storage backs the TMA maps)
    del q, k, v
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------------------------------------
# Decode
# ----------------------------------------------------------------------------------------------------------

def _decode_kernels(device_index: int):
    mod = _module("decode.cu", (), device_index)
    return (mod.get_function("sift_decode_count"), mod.get_function("sift_decode_write"),
            mod.get_function("sift_decode_scan"))


class CudaDecoder:
    """Bit vectors of one prompt, on the GPU once; CSR block lists per layer from kernels/decode.cu.

    Pass 1 runs for every layer in one launch when the decoder is built (counts → offsets with torch.cumsum,
    one device→host copy of the per-layer totals); `layer(l)` then runs pass 2 only, with no host sync.
    """

    def __init__(self, bits, block_m: int = 128, block_n: int = 64, layers: range | None = None):
        check_device(bits.la if bits.la.numel() else bits.doc_start, "the bit vectors")
        self.bits = bits
        self.device = bits.la.device
        self.block_m, self.block_n = block_m, block_n
        lay = bits.layout
        self.seq_len = lay.seq_len
        self.H = bits.n_heads
        self.M = -(-self.seq_len // block_m)
        self.layers = layers if layers is not None else range(bits.n_layers)
        t = {k: getattr(bits, k).contiguous() for k in
             ("la", "ca", "doc_start", "doc_len", "la_base", "la_len", "ca_base", "ca_len")}
        for name, dt in (("doc_start", torch.int32), ("doc_len", torch.int32), ("la_base", torch.int64),
                         ("la_len", torch.int32), ("ca_base", torch.int64), ("ca_len", torch.int32),
                         ("la", torch.uint8), ("ca", torch.uint8)):
            if t[name].dtype != dt:
                t[name] = t[name].to(dt)
            if t[name].device != self.device:
                raise SiftError("all PromptBits tensors must be on one device (PromptBits.to(device))")
        self._keep = t
        self.common = (t["la"].data_ptr(), t["ca"].data_ptr(), t["doc_start"].data_ptr(), t["doc_len"].data_ptr(),
                       t["la_base"].data_ptr(), t["la_len"].data_ptr(), t["ca_base"].data_ptr(),
                       t["ca_len"].data_ptr(), np.int32(len(lay.docs)), np.int32(lay.prefix_len),
                       np.int32(lay.docs_end), np.int32(self.seq_len), np.int32(bits.tile), np.int32(self.H),
                       np.int32(block_m), np.int32(block_n), np.int32(self.M))
        self.k_count, self.k_write, self.k_scan = _decode_kernels(self.device.index)
        self.offsets = self.count(self.layers.start, len(self.layers))  # [n, H, M + 1]
        self.nnz = self.offsets[:, -1, -1].tolist() if len(self.layers) else []

    def count(self, layer0: int, n_layers: int) -> torch.Tensor:
        """Pass 1 + prefix sum for layers layer0 .. layer0 + n_layers - 1 → offsets int32 [n, H, M + 1]."""
        H, M = self.H, self.M
        counts = torch.empty(n_layers, H, M, dtype=torch.int32, device=self.device)
        offsets = torch.zeros(n_layers, H, M + 1, dtype=torch.int32, device=self.device)
        if n_layers and M and H:
            _launch(self.k_count, (M, H, n_layers), (DEC_THREADS, 1, 1),
                    self.common + (np.int32(layer0), counts.data_ptr()), 0, self.device)
            _launch(self.k_scan, (n_layers, 1, 1), (SCAN_THREADS, 1, 1),
                    (counts.data_ptr(), np.int32(H), np.int32(M), offsets.data_ptr()), 0, self.device)
        return offsets

    def write(self, layer: int, offsets: torch.Tensor, indices: torch.Tensor) -> None:
        """Pass 2 for one layer into a preallocated int32 index array."""
        if self.M:
            _launch(self.k_write, (self.M, self.H, 1), (DEC_THREADS, 1, 1),
                    self.common + (np.int32(layer), offsets.data_ptr(), indices.data_ptr()), 0, self.device)

    def layer(self, layer: int) -> BlockLists:
        i = layer - self.layers.start
        if not 0 <= i < len(self.layers):
            raise SiftError(f"layer {layer} is outside the decoded range {self.layers}")
        offsets = self.offsets[i]
        indices = torch.empty(int(self.nnz[i]), dtype=torch.int32, device=self.device)
        self.write(layer, offsets, indices)
        return BlockLists(offsets, indices, self.block_m, self.block_n, self.seq_len)


def decode_layer_cuda(bits, layer: int, block_m: int = 128, block_n: int = 64) -> BlockLists:
    """SPEC §7 CSR lists of one layer, from bit vectors already on the GPU (identical to decode.decode_layer)."""
    return CudaDecoder(bits, block_m, block_n, layers=range(layer, layer + 1)).layer(layer)
