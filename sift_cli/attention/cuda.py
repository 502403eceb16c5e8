"""The Hopper backend: kernels/sparse_attn_fwd.cu through sift_cli.cuda (CuPy/NVRTC, sm_90a)."""

from __future__ import annotations

import torch

from ..cuda.attention import kernel_config, persistent_ctas
from ..cuda.plan import SparseAttentionPlan, sparse_attention_forward, stack_block_lists
from ..cuda.decode import WorkSpec
from ..cuda.work_order import SPLIT_MAX, SPLIT_MIN_BLOCKS
from ..errors import SiftError
from .base import BlockLists
from .features import PLAIN, LayerFeatures, apply_sinks, window_lists


def _windowed_plan(plan: SparseAttentionPlan, blocks: BlockLists, window: int, pair, split, merge):
    """A plan of one layer's lists without the blocks its window hides, beside the prompt's plan: worth its host
    time (a CSR rebuild and a work order) only when the window covers under half the prompt, and never inside a
    CUDA-graph capture (the rebuild syncs); None then, and the layer masks the hidden blocks instead."""
    if window * 2 > plan.L or torch.cuda.is_current_stream_capturing():
        return None
    lists = window_lists(blocks, window)
    return SparseAttentionPlan(lists.table, lists.offsets[None], lists.indices[None], plan.H, plan.H_kv, plan.D,
                               plan.scale, pair, split, merge=merge)


def featured_call(plan: SparseAttentionPlan, layer: int, q, k, v, scale: float, features: LayerFeatures):
    """One layer through `plan` with its features: the window and soft-cap compiled into a kernel variant, the
    sinks applied to the output through the LSE (`features.apply_sinks`)."""
    lse = None
    if features.sinks is not None:
        lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    out = plan(layer, q, k, v, lse=lse, scale=scale, variant=plan.variant(features.window, features.softcap))
    return apply_sinks(out, lse, features.sinks)


class CudaBackend:
    """Block-sparse attention with the bundled TMA + WGMMA kernel. bf16 only; no silent fallback."""

    name = "cuda"
    LONG_PROMPT = 49152  # from here on, at head_dim 128, 128-row blocks' throughput outweighs their extra cells
    # at head_dim 128, 128-row blocks from this share of unprofiled document tokens on: measured 1.5-7 % faster
    # TTFT with 19-100 % unprofiled, 0.5 % slower with none (8B-shaped, 16K and 32K, docs/benchmarks.md)
    DENSE_SHARE = 0.10
    # query blocks on the global grid from this share of selected tiles and pages on: nearly dense bits gain a
    # quarter fewer query blocks for ~0.1 % more cells; sparser ones lose cells (docs/kernels.md)
    GRID_SHARE = 0.95
    waits_for_ready = True  # prepare(..., ready=event): its lists may still be decoding on a side stream

    def __init__(self, pair: bool | None = None, split: bool = True, merge: bool = True):
        self.pair, self.split, self.merge = pair, split, merge  # merge: runs of blocks as full tiles (coalesce.py)

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
                return_lse: bool = False, features: LayerFeatures = PLAIN):
        if q.dtype != torch.bfloat16:
            raise SiftError(f"the cuda backend computes in bf16, got {q.dtype}; load the model in bf16")
        if not features.plain:
            if return_lse:
                raise ValueError("the log-sum-exp of a layer with attention features is not computed")
            b = blocks.to(q.device)
            plan = SparseAttentionPlan(b.table, b.offsets[None], b.indices[None], q.shape[0], k.shape[0],
                                       q.shape[2], scale, self.pair, self.split, merge=self.merge)
            return featured_call(plan, 0, q.contiguous(), k.contiguous(), v.contiguous(), scale, features)
        return sparse_attention_forward(q, k, v, blocks, scale, return_lse, pair=self.pair, split=self.split,
                                        merge=self.merge)

    def query_block_rows(self, head_dim: int, seq_len: int, dense_share: float = 0.0) -> int:
        """The query block size this kernel runs a prompt fastest with (measured, docs/kernels.md): 64 rows (a
        block is one 64-token tile row, so no cell outside the bits is computed; two CTAs share an SM), except at
        head_dim 128 for long prompts, where 64-row tiles' doubled K/V traffic costs more than the union of two
        tile rows' blocks, and for prompts with a `dense_share` of their document tokens unprofiled (computed
        densely: their blocks are all listed, so a 128-row block adds few cells) of DENSE_SHARE or more."""
        if head_dim != 128:
            return 64
        return 128 if seq_len >= self.LONG_PROMPT or dense_share >= self.DENSE_SHARE else 64

    def query_block_cut(self, selected_share: float) -> str:
        """How this kernel cuts a prompt's query blocks (block_table.py): on the global grid when the bits select
        GRID_SHARE or more of the prompt's tiles and pages (`PromptBits.selected_share`), else per segment."""
        return "grid" if selected_share >= self.GRID_SHARE else "segment"

    def work_spec(self, table, device, head_dim: int) -> WorkSpec:
        """What this backend's work order needs, for the kernel's lists made beside the decode
        (`cuda.coalesce.KernelLists`)."""
        cfg = kernel_config(head_dim, table.block_n, self.pair, block_m=table.block_m)
        return WorkSpec(cfg.per_step, persistent_ctas(cfg, table.n_kv_blocks, torch.device(device)),
                        SPLIT_MAX if self.split else 1, SPLIT_MIN_BLOCKS, self.merge)

    def prepare(self, table, block_lists: list[BlockLists], stacked=None, ready=None) -> "PlannedAttention":
        """attend(layer, q, k, v, scale) over every layer's lists, launched through one SparseAttentionPlan (built
        at the first call, when the heads and head dim are known). stacked: (offsets, indices[, tiles]) of all
        layers from one decode; tiles: the kernel's lists (`cuda.coalesce.KernelLists` for `work_spec`), else the
        plan makes them.
        ready: a CUDA event the first call makes the current stream wait for (lists decoded on a side stream)."""
        offsets, indices = stacked[:2] if stacked is not None else stack_block_lists(block_lists)
        tiles = stacked[2] if stacked is not None and len(stacked) > 2 else None  # else the plan makes them
        return PlannedAttention(table, offsets, indices, tiles, self.pair, self.split, ready, self.merge,
                                block_lists)


class PlannedAttention:
    """One prompt's attention for every layer through one SparseAttentionPlan, built at the first call:
    `attend(layer, q [H, L, D], k, v [H_kv, L, D], scale)` → an [H, L, D]-indexed tensor, and `model_layout`,
    the same in a Hugging Face attention function's layouts ([1, H, L, D] in, [1, L, H, D] out, no views)."""

    def __init__(self, table, offsets, indices, tiles, pair, split, ready, merge=True, block_lists=None):
        self.table, self.offsets, self.indices, self.tiles = table, offsets, indices, tiles
        self.pair, self.split, self.ready, self.merge = pair, split, ready, merge
        self.block_lists = block_lists  # per layer, for windowed layers' own lists
        self.plan: SparseAttentionPlan | None = None
        self._windowed: dict[int, SparseAttentionPlan | None] = {}

    def _build(self, q: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int, scale: float):
        if q.dtype != torch.bfloat16:
            raise SiftError(f"the cuda backend computes in bf16, got {q.dtype}; load the model in bf16")
        if self.ready is not None:
            torch.cuda.current_stream(q.device).wait_event(self.ready)
        self.plan = SparseAttentionPlan(self.table, self.offsets, self.indices, n_heads, n_kv_heads, head_dim, scale,
                                        self.pair, self.split, tiles=self.tiles, merge=self.merge)
        return self.plan

    def __call__(self, layer, q, k, v, scale):
        plan = self.plan or self._build(q, q.shape[0], k.shape[0], q.shape[2], scale)
        return plan(layer, q, k, v, scale=scale)

    def featured(self, layer, q, k, v, scale, features: LayerFeatures):
        """A layer with attention features (q [H, L, D], k/v [H_kv, L, D] → [H, L, D]-indexed)."""
        plan = self.plan or self._build(q, q.shape[0], k.shape[0], q.shape[2], scale)
        if features.window is not None and self.block_lists is not None:
            if layer not in self._windowed:
                self._windowed[layer] = _windowed_plan(plan, self.block_lists[layer], features.window, self.pair,
                                                       self.split, self.merge)
            if self._windowed[layer] is not None:
                return featured_call(self._windowed[layer], 0, q, k, v, scale, features)
        return featured_call(plan, layer, q, k, v, scale, features)

    def model_layout(self, layer, query, key, value, scale):
        plan = self.plan or self._build(query, query.shape[1], key.shape[1], query.shape[3], scale)
        return plan.model_call(layer, query, key, value, scale=scale)
