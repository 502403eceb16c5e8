"""Run a stock Hugging Face causal LM with SIFT's sparse attention in every layer.

A registered attention implementation ("sift") replaces only the attention product: projections, RoPE, the
KV cache and the MLP stay the model's own. Outside a `sparse_attention(...)` block, and for generation steps (one
query against a longer cache), it computes ordinary dense attention, so generation continues densely from
the KV cache the sparse prefill wrote.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import BlockLists
from .swap import swapped_attention

ATTN_NAME = "sift"
_local = threading.local()


@dataclass
class SparsePlan:
    backend: object
    block_lists: list[BlockLists]  # one per layer
    plans: list  # backend-specific prepared form of each layer's lists (or None)


def _dense(query, key, value, scaling):
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    causal = query.shape[2] > 1 and query.shape[2] == key.shape[2]
    if not causal and query.shape[2] > 1:  # queries appended to a cache: causal with an offset
        offset = key.shape[2] - query.shape[2]
        i = torch.arange(query.shape[2], device=query.device)[:, None] + offset
        mask = torch.arange(key.shape[2], device=query.device)[None, :] <= i
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling)


def sift_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention interface: query [B, H, Lq, D], key/value [B, H_kv, Lk, D] → ([B, Lq, H, D], None)."""
    plan: SparsePlan | None = getattr(_local, "plan", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if plan is None or query.shape[2] != key.shape[2] or query.shape[2] == 1:
        return _dense(query, key, value, scaling).transpose(1, 2).contiguous(), None
    if query.shape[0] != 1:
        raise ValueError("sparse prefill runs one prompt at a time (batch 1)")
    layer = module.layer_idx
    extra = {} if plan.plans[layer] is None else {"plan": plan.plans[layer]}
    out = plan.backend.forward(query[0], key[0], value[0], plan.block_lists[layer], scaling, **extra)
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None


def prepare_plan(backend, block_lists: list[BlockLists]) -> SparsePlan:
    prep = getattr(backend, "prepare", None)
    return SparsePlan(backend, block_lists, [prep(lay) if prep else None for lay in block_lists])


def sparse_attention(model, plan: SparsePlan):
    """Inside the block, the model's forward computes attention block-sparsely as `plan` says."""
    return swapped_attention(model, ATTN_NAME, sift_attention_forward, _local, plan=plan)
