"""The attention features of a loaded model, read from its config and attention modules as the pinned
transformers version defines them, and the refusal of every model whose attention sift cannot compute exactly.

Supported: causal softmax attention with GQA/MQA, any head_dim, the layer's own scaling (`scaling`, Gemma's
`query_pre_attn_scalar`), per-layer sliding windows, logit soft-capping and per-head sinks (`attention/features.py`
holds their math). Anything else is refused at load with one line naming the model type and the feature.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .errors import SiftError

# model_type → the attention module class whose forward we have read (its call passes exactly the features
# `attention.features.call_features` reads; other keyword arguments are positions and caches)
FAMILIES = {
    "llama": "LlamaAttention",
    "mistral": "MistralAttention",
    "ministral": "MinistralAttention",
    "qwen2": "Qwen2Attention",
    "qwen3": "Qwen3Attention",
    "gemma2": "Gemma2Attention",
    "gemma3_text": "Gemma3Attention",
    "phi3": "Phi3Attention",
    "gpt_oss": "GptOssAttention",
    "olmo2": "Olmo2Attention",
}
# families whose windowed attention reads config.sliding_window in every layer (no per-layer types)
WINDOW_FROM_CONFIG = ("mistral", "phi3")
# families transformers computes exactly only eagerly: gpt-oss (sinks; no SDPA path) and Gemma 2 with
# soft-capping (its SDPA path drops the cap): the model's own forward is loaded as "eager"
EAGER_ONLY = ("gpt_oss",)
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class ModelFeatures:
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    windows: tuple  # per layer: window in tokens, or None (full causal)
    softcap: float | None
    sinks: bool
    scaling: float

    @property
    def plain(self) -> bool:
        return not any(w is not None for w in self.windows) and self.softcap is None and not self.sinks

    def names(self) -> list[str]:
        out = []
        if any(w is not None for w in self.windows):
            out.append("sliding window")
        if self.softcap is not None:
            out.append("soft-capping")
        if self.sinks:
            out.append("sinks")
        return out

    def for_length(self, length: int) -> "ModelFeatures":
        """The features over a prompt of `length` tokens: windows of `length` or more hide nothing and are dropped
        (so a Mistral-style model whose prompt fits its window runs the plain kernels)."""
        return replace(self, windows=tuple(w if w is not None and w < length else None for w in self.windows))

    def as_dict(self) -> dict:
        return {"model_type": self.model_type, "head_dim": self.head_dim, "heads": self.n_heads,
                "kv_heads": self.n_kv_heads, "windows": list(self.windows), "softcap": self.softcap,
                "sinks": self.sinks, "scaling": self.scaling}


def _refuse(model_type: str, feature: str):
    raise SiftError(f"model type {model_type}: {feature} is not supported (sift computes causal softmax attention "
                    "with sliding windows, soft-capping and sinks exactly; see docs/models.md)")


def refuse_config(config) -> None:
    """Refuse, from the config alone, what sift does not compute (before any weight is read)."""
    mt = getattr(config, "model_type", None) or "unknown"
    if getattr(config, "is_encoder_decoder", False):
        _refuse(mt, "an encoder-decoder")
    if getattr(config, "kv_lora_rank", None) or getattr(config, "q_lora_rank", None):
        _refuse(mt, "multi-head latent attention (MLA)")
    types = set(getattr(config, "layer_types", None) or ())
    other = sorted(types - set(LAYER_TYPES))
    if other:
        _refuse(mt, f"layer type {other[0]} (linear, hybrid or chunked attention)")
    if getattr(config, "use_bidirectional_attention", False):
        _refuse(mt, "bidirectional attention")
    if mt not in FAMILIES:
        text = getattr(config, "text_config", None)
        if text is not None and getattr(text, "model_type", None) in FAMILIES:
            _refuse(mt, "a multimodal wrapper (load its text model)")
        _refuse(mt, "an attention that sift has not inventoried")


def _module_window(model_type: str, module, config):
    if model_type in WINDOW_FROM_CONFIG:
        return getattr(config, "sliding_window", None) or None
    return getattr(module, "sliding_window", None) or None


def inspect_model(model) -> ModelFeatures:
    """The inventory of `model`'s attention, or SiftError naming what it cannot compute."""
    config = model.config
    refuse_config(config)
    mt = config.model_type
    attn = [m.self_attn for m in model.modules() if isinstance(getattr(m, "self_attn", None), torch.nn.Module)]
    if len(attn) != config.num_hidden_layers:
        _refuse(mt, f"{len(attn)} attention modules for {config.num_hidden_layers} layers")
    for m in attn:
        if type(m).__name__ != FAMILIES[mt]:
            _refuse(mt, f"attention module {type(m).__name__}")
    attn.sort(key=lambda m: m.layer_idx)
    softcap = getattr(config, "attn_logit_softcapping", None) if mt == "gemma2" else None  # Gemma 3 ignores it
    scalings = {float(m.scaling) for m in attn}
    if len(scalings) != 1:
        _refuse(mt, "a scaling that differs between layers")
    heads = config.num_attention_heads
    return ModelFeatures(
        model_type=mt, n_layers=config.num_hidden_layers, n_heads=heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=int(getattr(attn[0], "head_dim", None) or config.hidden_size // heads),
        windows=tuple(_module_window(mt, m, config) for m in attn), softcap=softcap or None,
        sinks=any(getattr(m, "sinks", None) is not None for m in attn), scaling=scalings.pop())


def features_of(model) -> ModelFeatures:
    """`inspect_model`, once per model."""
    found = model.__dict__.get("_sift_features")
    if found is None:
        found = model.__dict__["_sift_features"] = inspect_model(model)
    return found


def attention_implementation(config, asked: str) -> str:
    """The implementation the model's own forward runs: `asked`, unless the family has only eager."""
    mt = getattr(config, "model_type", None)
    capped = mt == "gemma2" and getattr(config, "attn_logit_softcapping", None)
    return "eager" if (mt in EAGER_ONLY or capped) and asked == "sdpa" else asked
