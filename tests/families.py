"""Tiny random-weight models of every supported family, built offline from their configs: windows smaller than a
document, soft-capping small enough to bite, sinks, GQA/MQA and head dims other than 64/128."""

from __future__ import annotations

import torch

WINDOW = 24
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "ministral", "gemma2", "gemma3_text", "phi3", "gpt_oss", "olmo2")


VOCAB = 97


def _base(heads=4, kv_heads=2, head_dim=16, layers=2, vocab=None):
    vocab = vocab or VOCAB
    return dict(hidden_size=heads * head_dim, intermediate_size=2 * heads * head_dim, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
                max_position_embeddings=1024, initializer_range=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def family_config(name: str, head_dim: int | None = None):
    """name's tiny config; head_dim: instead of the family's own small one (64 or 128 for the cuda kernel)."""
    import transformers as tf

    def _common(**kw):
        if head_dim is not None:
            kw["head_dim"] = head_dim
        return _base(**kw)

    alternating = ["sliding_attention", "full_attention"]
    if name == "llama":
        return tf.LlamaConfig(**_common(head_dim=24))
    if name == "qwen2":  # sliding from layer max_window_layers on
        return tf.Qwen2Config(**_common(), use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if name == "qwen3":
        return tf.Qwen3Config(**_common(kv_heads=1), use_sliding_window=True, sliding_window=WINDOW,
                              max_window_layers=1)
    if name == "mistral":
        return tf.MistralConfig(**_common(), sliding_window=WINDOW)
    if name == "ministral":
        return tf.MinistralConfig(**_common(), sliding_window=WINDOW, layer_types=alternating)
    if name == "gemma2":
        return tf.Gemma2Config(**_common(head_dim=20), sliding_window=WINDOW, attn_logit_softcapping=2.0,
                               final_logit_softcapping=30.0, query_pre_attn_scalar=12, layer_types=alternating)
    if name == "gemma3_text":
        return tf.Gemma3TextConfig(**_common(head_dim=32), sliding_window=WINDOW, query_pre_attn_scalar=20,
                                   layer_types=alternating)
    if name == "phi3":
        c = _common()
        c.pop("head_dim")
        return tf.Phi3Config(**c, sliding_window=WINDOW)
    if name == "gpt_oss":
        return tf.GptOssConfig(**_common(), sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                               layer_types=alternating)
    if name == "olmo2":
        return tf.Olmo2Config(**_common(kv_heads=4))
    raise ValueError(name)


def family_model(name: str, seed: int = 0, dtype=torch.float32, head_dim: int | None = None):
    torch.manual_seed(seed)
    return _build(family_config(name, head_dim), dtype)


def _build(config, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    impl = "eager" if config.model_type == "gpt_oss" else "sdpa"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=dtype).eval()
    for m in model.modules():  # gpt-oss's sinks start at zero: make them matter
        if getattr(m, "sinks", None) is not None:
            m.sinks.data.normal_(0.0, 1.0)
    return model


def family_checkpoint(directory, name: str, tokenizer_dir, seed: int = 0):
    """An on-disk checkpoint of `name`'s tiny model with the tokenizer saved in `tokenizer_dir`."""
    from pathlib import Path

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.save_pretrained(directory)
    torch.manual_seed(seed)
    config = family_config(name)
    config.vocab_size = len(tok)
    _build(config).save_pretrained(directory)
    return Path(directory)
