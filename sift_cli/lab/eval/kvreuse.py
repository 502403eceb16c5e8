"""KV-reuse baselines: per-document KV caches, RoPE re-rotation, naive reuse and CacheBlend.

**Per-document caches.** Each document is run standalone as `prefix ‖ doc` (the same prefix it has online, as
CacheBlend's released example does with its system prompt); its keys (post-RoPE, at standalone positions
`P0 … P0+n-1`) and values are kept for every layer. The prefix's own KV is the same for every document.

**Re-rotation.** In the online prompt the document starts at `s` instead of `P0`. RoPE is a rotation per
frequency pair, R(p + δ) = R(δ)·R(p), so the stored keys are rotated by δ = s − P0 with the model's own
`inv_freq` (Llama-3 scaled frequencies included); values carry no position. CacheBlend's code stores pre-RoPE
keys and rotates them at the new positions, which is the same map.

**kv-reuse** (no recompute): the reused prefix+document KV is the cache; only the suffix is computed against it.

**cacheblend** (CacheBlend, EuroSys '25, as its released vLLM code does it):
- layers `< check_layer` (layer 0): every token is recomputed from scratch (fresh KV for all);
- layer `check_layer` (1): Q/K/V are computed for every token; the deviation of each non-suffix token is
  `Σ_heads Σ_dim (V_fresh − V_reused)²` (the released code's measure, on values); the `ratio` share of non-suffix
  tokens with the largest deviation (released default 0.16; the paper says ~15%, our default 0.15) plus every
  suffix token are selected; this layer attends with all-fresh K/V, for the selected queries only;
- layers after it: only the selected tokens are carried (projections, attention, MLP); their fresh K/V overwrite
  the reused K/V at their positions; the other positions keep the reused K/V.

*Mask.* The released code attends the selected queries with xformers' `LowerTriangularFromBottomRightMask`,
which aligns the causal diagonal to the bottom-right corner: an early selected token then also sees keys after
its own position. We use the exact positional causal mask by default (`mask="causal"`: selected token at position
p sees keys ≤ p) and offer the released code's alignment as `mask="bottom-right"`.

The blended forward is written against the Llama module layout (q/k/v/o projections, optional q_norm/k_norm,
RMSNorms, MLP, rotary embedding): Llama, Mistral, Qwen2/3, SmolLM2. With `ratio = 1` it is exactly the dense
forward (a test checks this).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ...config import CPU_DEFAULTS
from ...errors import SiftError
from ...models import LoadedModel
from ...profile.batches import padded_batch, plan_batches


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class DocKV:
    """Standalone KV of one document: keys and values per layer, [H_kv, n, D] each (model dtype)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def n_tokens(self) -> int:
        return self.keys[0].shape[1]


def is_llama_family(model) -> bool:
    """Decoder stack with q/k/v/o projections, RMSNorm, RoPE (Llama, Mistral, Qwen2/3, SmolLM): what the manual
    forward of `kvreuse` understands."""
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers") or not hasattr(base, "rotary_emb"):
        return False
    attn = base.layers[0].self_attn
    return all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and \
        hasattr(base.layers[0], "mlp")


@torch.inference_mode()
def standalone_kv(model, prefix_ids: list[int], docs: list[list[int]], batch_tokens: int = CPU_DEFAULTS.batch_tokens
                  ) -> tuple[DocKV, list[DocKV]]:
    """(prefix KV, per-document KV) from standalone `prefix ‖ doc` passes, batched with right padding (harmless
    under causal attention)."""
    device = next(model.parameters()).device
    base = getattr(model, "model", model)
    P0 = len(prefix_ids)
    out: list[DocKV | None] = [None] * len(docs)
    prefix_kv = None
    for batch in plan_batches([len(d) for d in docs], P0, batch_tokens):
        ids = padded_batch(prefix_ids, [docs[i] for i in batch])
        cache = base(input_ids=ids.to(device), use_cache=True).past_key_values
        layers = [(cache.layers[li].keys, cache.layers[li].values) for li in range(len(cache.layers))]
        for row, i in enumerate(batch):
            n = len(docs[i])
            out[i] = DocKV([k[row, :, P0:P0 + n].clone() for k, _ in layers],
                           [v[row, :, P0:P0 + n].clone() for _, v in layers])
        if prefix_kv is None:
            prefix_kv = DocKV([k[0, :, :P0].clone() for k, _ in layers], [v[0, :, :P0].clone() for _, v in layers])
    return prefix_kv, out


def inv_freq_of(model) -> torch.Tensor:
    base = getattr(model, "model", model)
    rot = getattr(base, "rotary_emb", None)
    if rot is None or not hasattr(rot, "inv_freq"):
        raise SiftError("KV-reuse baselines need a RoPE model with a shared rotary embedding (Llama family)")
    return rot.inv_freq.float()


def rotate(k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate keys [..., n, D] by RoPE angles `positions` [n] (a shift δ rotates post-RoPE keys from p to p + δ)."""
    ang = positions.to(torch.float32)[:, None] * inv_freq.to(k.device)[None, :]  # [n, D/2]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    kf = k.float()
    half = kf.shape[-1] // 2
    rot = torch.cat((-kf[..., half:], kf[..., :half]), dim=-1)
    return (kf * cos + rot * sin).to(k.dtype)


def reused_kv(prefix_kv: DocKV, doc_kvs: list[DocKV], starts: list[int], prefix_len: int, inv_freq: torch.Tensor
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, K and V [H_kv, prefix+docs, D] of the composed prompt from standalone caches, keys re-rotated."""
    n_layers = len(prefix_kv.keys)
    keys, values = [], []
    for li in range(n_layers):
        ks, vs = [prefix_kv.keys[li]], [prefix_kv.values[li]]
        for kv, s in zip(doc_kvs, starts):
            delta = torch.full((kv.n_tokens,), float(s - prefix_len), device=kv.keys[li].device)
            ks.append(rotate(kv.keys[li], delta, inv_freq) if s != prefix_len else kv.keys[li])
            vs.append(kv.values[li])
        keys.append(torch.cat(ks, dim=1))
        values.append(torch.cat(vs, dim=1))
    return keys, values


def make_cache(model, keys: list[torch.Tensor], values: list[torch.Tensor]):
    """A transformers DynamicCache holding [H_kv, n, D] per layer (batch 1)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for li, (k, v) in enumerate(zip(keys, values)):
        cache.update(k[None], v[None], li)
    return cache


@torch.inference_mode()
def kv_reuse_prefill(lm: LoadedModel, keys: list[torch.Tensor], values: list[torch.Tensor], suffix_ids: list[int]):
    """Naive reuse: the suffix computed against the reused cache. → (last logits fp32, cache, ms)."""
    _sync(lm.device)
    t0 = time.perf_counter()
    cache = make_cache(lm.model, keys, values)
    out = lm.model(input_ids=torch.tensor([suffix_ids], device=lm.device), past_key_values=cache, use_cache=True,
                   logits_to_keep=1)
    _sync(lm.device)
    return out.logits[0, -1].float(), out.past_key_values, (time.perf_counter() - t0) * 1e3


# ---- CacheBlend ------------------------------------------------------------------------------------------------

def _project(attn, h: torch.Tensor):
    """[1, n, d] → q [1, H, n, D], k/v [1, H_kv, n, D] (q_norm / k_norm applied when the model has them)."""
    n = h.shape[1]
    hd = attn.head_dim
    q = attn.q_proj(h).view(1, n, -1, hd)
    k = attn.k_proj(h).view(1, n, -1, hd)
    v = attn.v_proj(h).view(1, n, -1, hd).transpose(1, 2)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q.transpose(1, 2), k.transpose(1, 2), v


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def _attend(q, k, v, q_pos: torch.Tensor | None, scale: float, mask: str):
    """q [1, H, n, D] at positions q_pos (None: all positions, causal) over k/v [1, H_kv, S, D]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if q_pos is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    S, n = k.shape[2], q.shape[2]
    if mask == "bottom-right":
        try:
            from torch.nn.attention.bias import causal_lower_right

            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, S), scale=scale)
        except (ImportError, RuntimeError):
            limit = torch.arange(n, device=q.device) + (S - n)
    else:
        limit = q_pos
    allowed = torch.arange(S, device=q.device)[None, :] <= limit[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)


@dataclass
class BlendResult:
    logits: torch.Tensor  # fp32 [vocab], last position
    keys: list[torch.Tensor]  # final KV per layer [H_kv, S, D] (fresh where recomputed, reused elsewhere)
    values: list[torch.Tensor]
    selected: torch.Tensor  # positions recomputed after the check layer (suffix included)
    layer_ms: list[float]  # per-layer wall time (only when timed)


@torch.inference_mode()
def blend_forward(model, input_ids: torch.Tensor, load_kv: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                  suffix_len: int, ratio: float = 0.15, check_layer: int = 1, mask: str = "causal",
                  keep_kv: bool = True, layer_events: list | None = None) -> BlendResult:
    """CacheBlend prefill of one prompt (batch 1). load_kv(layer) → reused (K, V) [H_kv, S_reused, D] covering the
    positions before the suffix. Returns the last position's logits and the blended KV cache."""
    base = model.model
    S = input_ids.shape[-1]
    dev = input_ids.device
    x = base.embed_tokens(input_ids.view(1, S))
    cos, sin = base.rotary_emb(x, torch.arange(S, device=dev)[None])  # [1, S, D]
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    sel = None  # None: every position
    keys, values = [], []
    n_ctx = S - suffix_len
    for li, layer in enumerate(base.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = _project(attn, h)
        c, s = (cos, sin) if sel is None else (cos[:, :, sel], sin[:, :, sel])
        q, k = _rope(q, c, s), _rope(k, c, s)
        if li < check_layer:
            K, V = k, v
            out = _attend(q, K, V, None, attn.scaling, mask)
        elif li == check_layer:
            _, v_old = load_kv(li)
            dev_tok = ((v[0, :, :n_ctx].float() - v_old[:, :n_ctx].float()) ** 2).sum(dim=(0, 2))  # [n_ctx]
            top = int(n_ctx * ratio)
            idx = torch.topk(dev_tok, k=top).indices if top > 0 else torch.zeros(0, dtype=torch.long, device=dev)
            sel = torch.cat([torch.sort(idx).values, torch.arange(n_ctx, S, device=dev)])
            K, V = k, v
            q = q[:, :, sel]
            x = x[:, sel]
            out = _attend(q, K, V, sel, attn.scaling, mask)
        else:
            k_old, v_old = load_kv(li)
            K = torch.empty(1, k.shape[1], S, k.shape[-1], dtype=k.dtype, device=dev)
            V = torch.empty_like(K)
            K[0, :, :n_ctx], V[0, :, :n_ctx] = k_old[:, :n_ctx], v_old[:, :n_ctx]
            K[:, :, sel], V[:, :, sel] = k, v
            out = _attend(q, K, V, sel, attn.scaling, mask)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(1, out.shape[2], -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if keep_kv:
            keys.append(K[0])
            values.append(V[0])
        if layer_events is not None:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            layer_events.append(ev)
    x = base.norm(x[:, -1:])
    logits = model.lm_head(x)[0, -1].float()
    if sel is None:
        sel = torch.arange(S, device=dev)
    return BlendResult(logits, keys, values, sel, [])


def cacheblend_prefill(lm: LoadedModel, input_ids: list[int], keys: list[torch.Tensor], values: list[torch.Tensor],
                       suffix_len: int, ratio: float = 0.15, check_layer: int = 1, mask: str = "causal"):
    """CacheBlend on one prompt with reused KV in memory. → (last logits, DynamicCache, ms, recomputed share)."""
    ids = torch.tensor(input_ids, device=lm.device)
    _sync(lm.device)
    t0 = time.perf_counter()
    res = blend_forward(lm.model, ids, lambda li: (keys[li], values[li]), suffix_len, ratio, check_layer, mask)
    _sync(lm.device)
    ms = (time.perf_counter() - t0) * 1e3
    cache = make_cache(lm.model, res.keys, res.values)
    n_ctx = len(input_ids) - suffix_len
    share = (res.selected.numel() - suffix_len) / max(1, n_ctx)
    return res.logits, cache, ms, share
