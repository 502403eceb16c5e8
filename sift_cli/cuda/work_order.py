"""The attention kernel's work order: which virtual tile each persistent CTA takes next (it reads the order
through an atomic counter).

Tiles run longest first, which keeps the ragged per-row block counts of sparse layouts from leaving a tail. Where
the keys and values of all KV heads do not fit in the L2 cache (long prompts at head_dim 128), the order is then
regrouped by KV heads (`l2_group`, `grouped_for_l2`): the tiles running at any moment read the K and V of a few
heads that fit, instead of all heads' (docs/kernels.md, "Tile order and the L2 cache").
"""

from __future__ import annotations

import torch

SPLIT_MAX = 8  # a long row is cut into at most this many parts (split-KV) ...
SPLIT_MIN_BLOCKS = 16  # ... of at least this many blocks each
L2_SLACK = 1.1  # a group's K and V may exceed the L2 cache by this factor (64 MB against 60 measured best)


def work_order(offsets: torch.Tensor, per_step: int, ctas: int, split_max: int = SPLIT_MAX,
               min_blocks: int = SPLIT_MIN_BLOCKS) -> dict[str, torch.Tensor]:
    """The kernel's virtual tiles for lists `offsets` int32 [..., H, M + 1] (any leading layer dims), on the device
    with no host synchronisation.

    A row (h, m) of n blocks is cut into parts of about `cap` blocks, cap = max(min_blocks, total / ctas), so
    only rows longer than a persistent CTA's fair share are split (the kernel computes the same cut,
    `split_row`). The parts run longest first (ties: first parts before second parts, then rows in order).
    Returns per leading index: tile_order [R * split_max] (virtual tile ids, row * split_max + part; the first
    n_active are the tiles), n_active [1], cap [1], slot_base [R] (first workspace slot of a split row). The CUDA
    kernel's tiles compute the same (`cuda.coalesce.KernelLists`, in decode.cu's prefix-sum launch); this is its
    reference."""
    lead = offsets.shape[:-2]
    counts = (offsets[..., 1:] - offsets[..., :-1]).reshape(*lead, -1).long()  # [..., R]
    total = counts.sum(-1, keepdim=True)
    cap = torch.clamp((total + ctas - 1) // ctas, min=min_blocks)
    parts = torch.clamp((counts + cap - 1) // cap, min=1, max=split_max)
    chunk = torch.clamp(((counts + parts - 1) // parts + per_step - 1) // per_step * per_step, min=1)
    parts = torch.where(counts > 0, (counts + chunk - 1) // chunk, torch.ones_like(counts))
    part = torch.arange(split_max, device=offsets.device)
    length = torch.minimum(torch.clamp(counts[..., None] - part * chunk[..., None], min=0), chunk[..., None])
    active = part < parts[..., None]
    key = torch.where(active, length, torch.full_like(length, -1))  # [..., R, split_max]
    # longest first; ties in part-major order (part, then row), as the CUDA decoder sorts them (decode.cu)
    u = torch.argsort(key.transpose(-1, -2).reshape(*lead, -1), dim=-1, descending=True, stable=True)
    n_rows = counts.shape[-1]
    order = ((u % n_rows) * split_max + u // n_rows).to(torch.int32)
    split_parts = torch.where(parts > 1, parts, torch.zeros_like(parts))
    return {"tile_order": order.contiguous(), "n_active": active.reshape(*lead, -1).sum(-1, keepdim=True).int(),
            "cap": cap.int(), "slot_base": (torch.cumsum(split_parts, -1) - split_parts).int().contiguous()}


def l2_group(seq_len: int, head_dim: int, n_kv_heads: int, l2_bytes: int) -> int:
    """KV heads whose tiles run together: all of them when their K and V (bf16) fit in the L2 cache, else the
    largest power of two of heads that fits (at least one)."""
    per_head = 2 * 2 * seq_len * head_dim  # K and V, bf16
    if n_kv_heads * per_head <= L2_SLACK * l2_bytes:
        return n_kv_heads
    g = 1
    while 2 * g < n_kv_heads and 2 * g * per_head <= L2_SLACK * l2_bytes:
        g *= 2
    return g


def grouped_for_l2(work: dict[str, torch.Tensor], n_heads: int, n_query_blocks: int, kv_heads_per_group: int,
                   group: int, split_max: int = SPLIT_MAX) -> dict[str, torch.Tensor]:
    """`work` (from `work_order` or the CUDA decoder) with its active tiles stably regrouped by KV-head group: the
    tiles of heads [0, kv_heads_per_group * group) first, each group in its longest-first order; on the device,
    with no host synchronisation. group: query heads per KV head."""
    order = work["tile_order"]
    if kv_heads_per_group * group >= n_heads:
        return work
    lead, width = order.shape[:-1], order.shape[-1]
    head = order.long() // split_max // n_query_blocks
    kv_group = head // (group * kv_heads_per_group)
    active = torch.arange(width, device=order.device) < work["n_active"]  # [..., width]
    key = torch.where(active, kv_group, torch.full_like(kv_group, n_heads))  # inactive entries stay last
    perm = torch.argsort(key.reshape(-1, width), dim=-1, stable=True).reshape(*lead, width)
    return {**work, "tile_order": torch.gather(order, -1, perm).contiguous()}
