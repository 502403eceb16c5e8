"""The launch of the Hopper block-sparse attention forward (kernels/sparse_attn_fwd.cu) for one prompt.

`SparseAttentionPlan` holds everything one prompt needs on the device, prepared once (the block table, every
layer's CSR lists and work order, the split-KV workspace, the compiled kernel, packed launch arguments and TMA
descriptor templates); a call for one layer re-targets three descriptors and two pointers and launches — no
device synchronisation, no per-layer allocation besides the output, so it can be captured in a CUDA graph.
`sparse_attention_forward(q, k, v, blocks, scale)` is the one-layer convenience the tests and benchmarks use.
"""

from __future__ import annotations

import math

import torch

from ..attention.base import BlockLists
from ..block_table import BlockTable
from ..errors import SiftError
from .attention import attention_function, kernel_config, persistent_ctas
from .coalesce import KernelLists
from .decode import WorkSpec
from .runtime import PackedLaunch, TensorMapTemplate, check_device, l2_bytes, stream_handle
from .work_order import SPLIT_MAX, SPLIT_MIN_BLOCKS, grouped_for_l2, l2_group


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
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
    return H, H_kv, L, D


def _tma_readable(t: torch.Tensor) -> bool:
    """Can TMA read the bf16 view t as it is: unit-stride head dim, 16-byte strides and start."""
    return t.stride(-1) == 1 and all((s * 2) % 16 == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    return t if _tma_readable(t) else t.contiguous()


class SparseAttentionPlan:
    """One prompt's sparse attention on the device: `plan(layer, q, k, v)` → out [L, H, D] (bf16).

    table: the prompt's BlockTable; offsets int32 [n_layers, H, M + 1] and indices int32 [n_layers, capacity]
    (every layer's canonical CSR lists, e.g. from CudaDecoder); scale: the softmax scale; tiles: the lists as the
    kernel reads them (`coalesce.KernelLists`, its work order for this plan's pairing, split and CTAs) when already
    made, e.g. on a side stream; merge: runs of consecutive blocks computed as full tiles (False: a tile per block,
    for comparisons); l2_heads: KV heads whose tiles run together (None: as many as the device's L2 cache holds,
    `work_order.l2_group`).
    """

    def __init__(self, table: BlockTable, offsets: torch.Tensor, indices: torch.Tensor, n_heads: int,
                 n_kv_heads: int, head_dim: int, scale: float, pair: bool | None = None, split: bool = True,
                 stages: int | None = None, extra: dict | None = None, tiles: KernelLists | None = None,
                 l2_heads: int | None = None, merge: bool = True):
        self.device = offsets.device
        check_device(offsets, "the block lists")
        self.cfg = kernel_config(head_dim, table.block_n, pair, stages, table.block_m)
        self.table = table.to(self.device)
        self.H, self.H_kv, self.D, self.L = n_heads, n_kv_heads, head_dim, table.seq_len
        M, N = table.n_query_blocks, table.n_kv_blocks
        if n_kv_heads <= 0 or n_heads % n_kv_heads:
            raise SiftError(f"query heads {n_heads} are not a multiple of KV heads {n_kv_heads}")
        if tuple(offsets.shape[1:]) != (n_heads, M + 1):
            raise SiftError(f"block lists are [{offsets.shape[1]}, {offsets.shape[2] - 1}] (heads, query blocks); "
                            f"the model has {n_heads} heads and the table {M} query blocks")
        split_max = SPLIT_MAX if split else 1
        self.extra = dict(extra or {})
        self._variants: dict[tuple, int] = {}  # (window, softcap) → the kernel variant computing them
        self.func, self.smem = attention_function(self.cfg, self.device.index, N, extra)
        ctas = persistent_ctas(self.cfg, N, self.device, extra)
        if tiles is None:  # the kernel reads the tiles alone; the block lists only make them
            tiles = KernelLists(offsets.contiguous(), indices.contiguous(), self.table,
                                WorkSpec(self.cfg.per_step, ctas, split_max, SPLIT_MIN_BLOCKS, merge))
        self.tiles = tiles
        work = tiles.work
        if l2_heads is None:
            l2_heads = l2_group(self.L, head_dim, n_kv_heads, l2_bytes(self.device))
        self.work = grouped_for_l2(work, n_heads, M, l2_heads, n_heads // n_kv_heads, split_max)
        ws_slots = 4 * ctas + 8 if split else 1  # split parts never exceed 2 * total / cap <= 2 CTAs' worth
        self.workspace, self.arrivals, self.sched = _scratch(self.device,
                                                             ws_slots * self.cfg.block_m * (head_dim + 2), n_heads * M)
        self.grid = (min(n_heads * M * split_max, ctas), 1, 1)
        self.split_max = split_max
        self.scale = scale
        self._templates: dict[str, TensorMapTemplate] = {}  # q, k, v descriptors, re-targeted per call
        self._launch: PackedLaunch | None = None
        self._strides: tuple = ()  # q, k, v strides the launch was packed for ([H, L, D] views)
        self._model_shapes: tuple = ()  # model_call's [1, H, L, D] inputs' shapes and strides the launch fits
        self._pointers: list[tuple[int, ...]] = []

    def _prepare_launch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> PackedLaunch:
        t = self.table
        self._templates = {"q": TensorMapTemplate(q, self.cfg.block_m), "k": TensorMapTemplate(k, self.cfg.key_block),
                           "v": TensorMapTemplate(v, self.cfg.key_block)}
        self._strides = (q.stride(), k.stride(), v.stride())
        args = [("tq", "map", self._templates["q"].map), ("tk", "map", self._templates["k"].map),
                ("tv", "map", self._templates["v"].map), ("out", "p", 0), ("out_row_stride", "l", self.H * self.D),
                ("out_head_stride", "l", self.D), ("lse", "p", 0), ("offsets", "p", 0), ("entries", "p", 0),
                ("q_start", "p", t.q_start.data_ptr()), ("q_len", "p", t.q_len.data_ptr()), ("tile_order", "p", 0),
                ("n_active", "p", 0), ("split_cap", "p", 0), ("split_max", "i", self.split_max),
                ("split_slot", "p", 0), ("ws", "p", self.workspace.data_ptr()),
                ("arrivals", "p", self.arrivals.data_ptr()), ("sched", "p", self.sched.data_ptr()),
                ("seq_len", "i", self.L), ("n_heads", "i", self.H), ("group", "i", self.H // self.H_kv),
                ("n_qblocks", "i", t.n_query_blocks), ("list_cap", "i", t.n_kv_blocks),
                ("scale_log2", "f", self.scale * math.log2(math.e)), ("write_lse", "i", 0)]
        return PackedLaunch(self.func, self.grid, (self.cfg.threads, 1, 1), self.smem, args)

    def _layer_pointers(self) -> list[tuple[int, ...]]:
        """Per layer, the addresses of its lists and work order (looked up once, not per call)."""
        def rows(t: torch.Tensor) -> list[int]:  # addresses of t[0], t[1], ... without a view of each
            base, step = t.data_ptr(), t.stride(0) * t.element_size()
            return [base + i * step for i in range(t.shape[0])]

        w = self.work
        return list(zip(*(rows(t) for t in (self.tiles.offsets, self.tiles.entries, w["tile_order"], w["n_active"],
                                             w["cap"], w["slot_base"]))))

    def variant(self, window: int | None, softcap: float | None) -> int | None:
        """The kernel variant with a sliding window and/or soft-capping compiled in (None: the plain kernel). Its
        defines change no shared memory or launch argument, so it launches with the plain kernel's arguments."""
        if window is None and softcap is None:
            return None
        key = (window, softcap)
        func = self._variants.get(key)
        if func is None:
            extra = dict(self.extra)
            if window is not None:
                extra["WINDOW"] = int(window)
            if softcap is not None:
                extra.update(SOFTCAP=1, SOFTCAP_VALUE=repr(float(softcap)))
            func = self._variants[key] = attention_function(self.cfg, self.device.index, self.table.n_kv_blocks,
                                                            extra)[0]
        return func

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                 scale: float | None = None, variant: int | None = None) -> torch.Tensor:
        """q [H, L, D], k/v [H_kv, L, D] bf16 views (any strides with a unit-stride head dim) → out, an [H, L, D]
        view; without `out` a fresh [L, H, D] buffer is written (the layout the model's o_proj reads) and its
        [H, L, D] view returned; an `out` the kernel's 16-byte stores cannot reach (`vector_aligned`) is filled
        from a fresh buffer. lse: fp32 [H, L] to fill, or None. variant: a kernel from `variant(...)`.

        After the first call a layer costs a few microseconds of host time: the descriptors are re-targeted (their
        shapes and strides are checked against the first call's), a handful of arguments change, one launch."""
        q, k, v = self._ready(q, k, v, (q.stride(), k.stride(), v.stride()))
        target = None  # a caller's `out` the kernel cannot store into with 16-byte stores: copied into at the end
        if out is not None and not vector_aligned(out):
            target, out = out, None
        if out is None:
            out = torch.empty(self.L, self.H, self.D, dtype=torch.bfloat16, device=self.device).transpose(0, 1)
        self._launch_layer(layer, (q.data_ptr(), k.data_ptr(), v.data_ptr()), out.data_ptr(), out.stride(1),
                           out.stride(0), lse, scale, variant)
        if target is not None:
            return target.copy_(out)
        return out

    def model_call(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scale: float | None = None) -> torch.Tensor:
        """The same attention in the layouts of a Hugging Face attention function: query [1, H, L, D], key/value
        [1, H_kv, L, D] → [1, L, H, D] (what the model reshapes for o_proj). A layer's call makes no view of its
        inputs or output: at a microsecond or two each, six views were a third of a small model's per-layer host
        time. Inputs the kernel cannot read as they are take `__call__`'s path (copied first)."""
        shapes = (query.shape, key.shape, query.stride(), key.stride(), value.stride())
        ptrs = (query.data_ptr(), key.data_ptr(), value.data_ptr())
        if shapes != self._model_shapes or (ptrs[0] | ptrs[1] | ptrs[2]) & 15:
            q, k, v = query[0], key[0], value[0]
            if not all(_tma_readable(t) for t in (q, k, v)):  # test only: the fallback copies
                return self(layer, q, k, v, scale=scale).transpose(0, 1).unsqueeze(0)
            self._ready(q, k, v, (q.stride(), k.stride(), v.stride()))
            self._model_shapes = shapes
        out = torch.empty(1, self.L, self.H, self.D, dtype=torch.bfloat16, device=self.device)
        self._launch_layer(layer, ptrs, out.data_ptr(), self.H * self.D, self.D, None, scale)
        return out

    def _ready(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, strides: tuple) -> tuple:
        """q, k, v as the kernel can read them; the launch packed at the first call or when the strides change."""
        if (self._launch is None or strides != self._strides or q.shape[1] != self.L
                or (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15):
            q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
            _check_qkv(q, k, v)
            if q.shape[1] != self.L or q.shape[0] != self.H or k.shape[0] != self.H_kv or q.shape[2] != self.D:
                raise SiftError(f"the plan is for H={self.H}, H_kv={self.H_kv}, L={self.L}, D={self.D}; attention "
                                f"has q {tuple(q.shape)}, k {tuple(k.shape)}")
            self._launch = self._prepare_launch(q, k, v)
            self._pointers = self._layer_pointers()
            self._model_shapes = ()  # model_call checks its inputs against the new launch
        return q, k, v

    def _launch_layer(self, layer: int, qkv_ptrs: tuple[int, int, int], out_ptr: int, row_stride: int,
                      head_stride: int, lse: torch.Tensor | None, scale: float | None,
                      variant: int | None = None) -> None:
        """Re-target the descriptors at q, k, v (addresses of views with the packed launch's strides) and launch
        layer `layer`, writing out[h, row] at out_ptr + (row * row_stride + h * head_stride) * 2 bytes."""
        launch = self._launch
        if scale is not None and scale != self.scale:
            self.scale = scale
            launch.set("scale_log2", scale * math.log2(math.e))
        values = launch.values
        values["out_row_stride"].value, values["out_head_stride"].value = row_stride, head_stride
        tpl = self._templates
        tpl["q"].point(qkv_ptrs[0])
        tpl["k"].point(qkv_ptrs[1])
        tpl["v"].point(qkv_ptrs[2])
        values["out"].value = out_ptr
        values["lse"].value = lse.data_ptr() if lse is not None else 0
        values["write_lse"].value = 1 if lse is not None else 0
        (values["offsets"].value, values["entries"].value, values["tile_order"].value, values["n_active"].value,
         values["split_cap"].value, values["split_slot"].value) = self._pointers[layer]
        if self.L:
            launch(stream_handle(self.device), variant)


def vector_aligned(out: torch.Tensor) -> bool:
    """Can the kernel write `out` ([H, L, D]-indexed bf16) directly? Its epilogue stores 8 consecutive columns at
    once (16 bytes): unit-stride columns, row and head strides in whole 8-column groups, a 16-byte-aligned start."""
    return out.stride(2) == 1 and out.stride(0) % 8 == 0 and out.stride(1) % 8 == 0 and out.data_ptr() % 16 == 0


_SCRATCH: dict = {}
_KEPT: list = []


def _scratch(device: torch.device, ws_floats: int, n_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's split-KV workspace, per-row arrival counters and scheduler counters, shared by every plan on
    the device (one prefill runs at a time): allocating 20 MB per prompt costs a cudaMalloc. The counters are
    zero between launches (the kernel leaves them so). A buffer outgrown is kept, not freed: a captured CUDA graph
    may still point at it."""
    key = device.index
    ws, arrivals, sched = _SCRATCH.get(key, (None, None, None))
    if ws is None or ws.numel() < ws_floats:
        _KEPT.append(ws)
        ws = torch.empty(ws_floats, dtype=torch.float32, device=device)
    if arrivals is None or arrivals.numel() < n_rows:
        _KEPT.append(arrivals)
        arrivals = torch.zeros(max(n_rows, 2 * (arrivals.numel() if arrivals is not None else 0), 1024),
                               dtype=torch.int32, device=device)
    if sched is None:
        sched = torch.zeros(2, dtype=torch.int32, device=device)
    _SCRATCH[key] = (ws, arrivals, sched)
    return ws, arrivals, sched


def stack_block_lists(block_lists: list[BlockLists]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer lists → offsets [n_layers, H, M + 1], indices [n_layers, capacity] (the plan's form)."""
    capacity = max(1, max(int(b.indices.numel()) for b in block_lists))
    offsets = torch.stack([b.offsets for b in block_lists])
    indices = torch.zeros(len(block_lists), capacity, dtype=torch.int32, device=offsets.device)
    for i, b in enumerate(block_lists):
        indices[i, : b.indices.numel()] = b.indices
    return offsets, indices


def sparse_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BlockLists,
                             scale: float, return_lse: bool = False, out: torch.Tensor | None = None,
                             lse: torch.Tensor | None = None, pair: bool | None = None, split: bool = True,
                             stages: int | None = None, extra: dict | None = None, l2_heads: int | None = None,
                             merge: bool = True):
    """Block-sparse causal attention of one layer: q [H, L, D], k/v [H_kv, L, D] bf16 → out [H, L, D] bf16
    (+ lse [H, L] fp32). `blocks` are canonical lists over their table (masked blocks first in each row); `out`
    may be any [H, L, D]-indexed view (e.g. of an [L, H, D] buffer); l2_heads, merge: as `SparseAttentionPlan`'s."""
    H, H_kv, L, D = _check_qkv(q, k, v)
    if blocks.seq_len != L or blocks.n_heads != H:
        raise SiftError(f"block lists are for H={blocks.n_heads}, L={blocks.seq_len}; attention has H={H}, L={L}")
    if blocks.offsets.dtype != torch.int32 or blocks.indices.dtype != torch.int32:
        raise SiftError("block list offsets and indices must be int32")
    blocks = blocks.to(q.device)
    if out is None:
        out = torch.empty(H, L, D, dtype=torch.bfloat16, device=q.device)
    elif tuple(out.shape) != (H, L, D) or out.dtype != torch.bfloat16:
        raise SiftError("out must be a bf16 [H, L, D] tensor (or view)")
    if return_lse and lse is None:
        lse = torch.empty(H, L, dtype=torch.float32, device=q.device)
    plan = SparseAttentionPlan(blocks.table, blocks.offsets[None], blocks.indices[None], H, H_kv, D, scale, pair,
                               split, stages, extra, l2_heads=l2_heads, merge=merge)
    plan(0, q, k, v, out=out, lse=lse if return_lse else None)
    return (out, lse) if return_lse else out
