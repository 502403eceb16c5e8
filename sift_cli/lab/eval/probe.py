"""Run a model's ordinary dense forward and hand every layer's post-RoPE queries and keys to a callback.

The attention output itself is plain causal SDPA, so the forward is the model's dense forward; the callback sees
q [H, L, D] and k [H_kv, L, D] of batch row 0 and may compute whatever statistics it likes, in bounded memory.
"""

from __future__ import annotations

import threading

import torch

from ...attention.swap import swapped_attention
from ...attention.features import call_features
from ...profile.forward import model_attention

ATTN_NAME = "sift_eval_probe"
_local = threading.local()


def _probe_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    callback = getattr(_local, "callback", None)
    if callback is not None and query.shape[2] == key.shape[2]:
        callback(module.layer_idx, query[0], key[0], scaling)
    return model_attention(query, key, value, scaling, call_features(kwargs)).transpose(1, 2).contiguous(), None


def attention_probe(model, callback):
    """Inside the block, the model's dense forward hands every layer's q and k to `callback`."""
    return swapped_attention(model, ATTN_NAME, _probe_attention, _local, callback=callback)


@torch.inference_mode()
def probe_forward(model, input_ids: list[int], callback) -> None:
    """Dense forward of one prompt through the decoder stack (no LM head); callback(layer, q, k, scale)."""
    device = next(model.parameters()).device
    with attention_probe(model, callback):
        base = getattr(model, "model", model)
        base(input_ids=torch.tensor([input_ids], device=device), use_cache=False)
