"""Run a stock Hugging Face causal LM with SIFT's sparse attention in every layer.

A registered attention implementation ("sift") replaces only the attention product: projections, RoPE, the
KV cache and the MLP stay the model's own. Outside a `sparse_attention(...)` block, and for generation steps (one
query against a longer cache), it computes ordinary dense attention, so generation continues densely from
the KV cache the sparse prefill wrote.

Everything that depends only on the prompt is prepared once (`prepare_plan`): the backend turns the prompt's
block table and every layer's lists into an `attend(layer, q, k, v, scale)` function, so a layer's call does no
more host work than the attention call itself.

A layer whose call carries attention features (sliding window, soft-capping, sinks: `features.py`) computes them
on every path: dense calls through `features.dense_featured`, sparse ones through the backend's `featured` form
(flex; cuda: kernel variants with the window and soft-cap compiled in, sinks through the LSE) or the banded
reference (reference, gather: exact, not tuned).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from ..block_table import BlockTable
from .base import BlockLists
from .features import LayerFeatures, call_features, dense_featured, for_length
from .reference import BAND_ROWS, ReferenceBackend
from .swap import swapped_attention

ATTN_NAME = "sift"
_local = threading.local()

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


@dataclass
class SparsePlan:
    """One prompt's sparse attention for every layer: `attend(layer, q [H, L, D], k, v [H_kv, L, D], scale)` →
    out, an [H, L, D]-indexed tensor."""

    backend_name: str
    table: BlockTable
    block_lists: list[BlockLists] = field(repr=False)  # one per layer
    attend: Attend = field(repr=False)
    # the same in the layouts of the model's attention call (query [1, H, L, D], key/value [1, H_kv, L, D] →
    # [1, L, H, D]), where the backend has it: the forward then makes no view per layer
    attend_model: Attend | None = field(default=None, repr=False)
    # attend(layer, q, k, v, scale, features) for a layer with attention features, or None (refused)
    attend_featured: Callable | None = field(default=None, repr=False)


def _dense(query, key, value, scaling, feats: LayerFeatures | None = None):
    if feats is not None and not feats.plain:
        return dense_featured(query, key, value, scaling, feats)
    group = query.shape[1] // key.shape[1]
    causal = query.shape[2] > 1 and query.shape[2] == key.shape[2]
    if not causal and query.shape[2] > 1:  # queries appended to a cache: causal with an offset
        offset = key.shape[2] - query.shape[2]
        i = torch.arange(query.shape[2], device=query.device)[:, None] + offset
        mask = torch.arange(key.shape[2], device=query.device)[None, :] <= i
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                              enable_gqa=group > 1)
    return F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling, enable_gqa=group > 1)


def sift_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention interface: query [B, H, Lq, D], key/value [B, H_kv, Lk, D] → ([B, Lq, H, D], None)."""
    plan: SparsePlan | None = getattr(_local, "plan", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    feats = call_features(kwargs)
    if plan is None or query.shape[2] != key.shape[2] or query.shape[2] == 1:
        return _dense(query, key, value, scaling, feats).transpose(1, 2), None
    if query.shape[0] != 1:
        raise ValueError("sparse prefill runs one prompt at a time (batch 1)")
    feats = for_length(feats, key.shape[2])
    if not feats.plain:
        if plan.attend_featured is None:
            raise ValueError(f"the {plan.backend_name} backend does not compute {', '.join(feats.names())}")
        out = plan.attend_featured(module.layer_idx, query[0], key[0], value[0], scaling, feats)
        return out.transpose(0, 1).unsqueeze(0), None
    if plan.attend_model is not None:
        return plan.attend_model(module.layer_idx, query, key, value, scaling), None
    out = plan.attend(module.layer_idx, query[0], key[0], value[0], scaling)  # [H, L, D]-indexed
    return out.transpose(0, 1).unsqueeze(0), None  # the model reshapes (and copies only if it must)


def prepare_plan(backend, table: BlockTable, block_lists: list[BlockLists], stacked=None, ready=None) -> SparsePlan:
    """The backend's per-prompt form of every layer's lists. stacked: (offsets [n_layers, H, M + 1], indices
    [n_layers, capacity], the cuda kernel's tiles or None) when the lists come from one decode of all layers (the
    cuda backend uses it as is). ready: a CUDA event the lists wait for, for a backend that `waits_for_ready`."""
    prepare = getattr(backend, "prepare", None)
    if prepare is not None:
        attend = prepare(table, block_lists, stacked) if ready is None else prepare(table, block_lists, stacked,
                                                                                     ready=ready)
    else:
        def attend(layer, q, k, v, scale):
            return backend.forward(q, k, v, block_lists[layer], scale)
    return SparsePlan(backend.name, table, block_lists, attend, getattr(attend, "model_layout", None),
                      getattr(attend, "featured", None) or featured_attend(backend, block_lists))


def featured_attend(backend, block_lists: list[BlockLists]) -> Callable | None:
    """attend(layer, q, k, v, scale, features) of `backend` for layers with attention features: its own
    `featured` form (flex; cuda's comes with its prepared attend), the banded reference for the CPU backends."""
    own = getattr(backend, "featured", None)
    if own is not None:
        return own(block_lists)
    if backend.name not in ("reference", "gather"):
        return None
    reference = ReferenceBackend(getattr(backend, "compute_dtype", torch.float32), rows=BAND_ROWS)

    def attend(layer, q, k, v, scale, features):
        return reference.forward(q, k, v, block_lists[layer], scale, features=features)

    return attend


def sparse_attention(model, plan: SparsePlan):
    """Inside the block, the model's forward computes attention block-sparsely as `plan` says."""
    return swapped_attention(model, ATTN_NAME, sift_attention_forward, _local, plan=plan)


def causal_attention(model):
    """Inside the block, attention over a whole prompt is SDPA's causal call, whatever mask transformers built (a
    prefill of one unpadded prompt has the causal mask). Under CUDA-graph capture transformers materialises that
    mask (it cannot look at the padding there), and SDPA given a mask at GQA shapes leaves cuDNN for a kernel that
    ran the 8B-shaped attention 3.8x slower at 16K on the H200; eager, transformers makes this same call."""
    return swapped_attention(model, ATTN_NAME, sift_attention_forward, _local, plan=None)
