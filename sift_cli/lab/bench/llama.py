"""Random-weight Llama models with published shapes, for speed measurements (speed does not depend on weight
values; no 8B-class weights reach the benchmark machine). One builder serves `bench profile` and `bench prefill`."""

from __future__ import annotations

import torch

from ...models import LoadedModel, config_hash


# Llama-3-8B as published (8K context): what `bench profile` profiles 2K- and 8K-token documents with.
LLAMA3_8B_CONFIG = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}
LLAMA3_8B_NAME = "Llama-3-8B-shaped (random bf16 weights)"

# Llama-3.1-8B: the same shapes with a 128K context and Llama-3 RoPE scaling: what `bench prefill` runs to 64K.
LLAMA31_8B_CONFIG = {**{k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "rope_theta"},
                     "max_position_embeddings": 131072, "eos_token_id": 128009,
                     "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}}
LLAMA31_8B_NAME = "Llama-3-8B-shaped (Llama-3.1-8B config, random bf16 weights)"


class IdTokenizer:
    """A stand-in tokenizer for models without one here: text is whitespace-separated token ids."""

    chat_template = None
    backend_tokenizer = None
    add_bos_token = True

    def __init__(self, vocab_size: int, bos_token_id: int | None = None):
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict:
        return {"<token ids as text>": 0}

    def _ids(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def __call__(self, text, add_special_tokens: bool = False):
        if isinstance(text, str):
            return {"input_ids": self._ids(text)}
        return {"input_ids": [self._ids(t) for t in text]}


def random_llama(config: dict | None = None, device: str = "cuda", dtype=torch.bfloat16, seed: int = 0,
                 name: str | None = None):
    """A LoadedModel of a Llama built from `config` (default: Llama-3-8B's) with random weights, built directly on
    `device` in `dtype`, SDPA attention, and an `IdTokenizer`."""
    from transformers import LlamaConfig, LlamaForCausalLM


    cfg = LlamaConfig(**(config or LLAMA3_8B_CONFIG))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.to(device=device, dtype=dtype)
    model.set_attn_implementation("sdpa")
    model.eval()
    tok = IdTokenizer(cfg.vocab_size, cfg.bos_token_id)
    name = name or (LLAMA3_8B_NAME if config is None else "random Llama")
    return LoadedModel(model, tok, name, "random", f"random-seed-{seed}", config_hash(cfg), torch.device(device),
                       dtype)
