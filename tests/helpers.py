"""Shared test fixtures: tiny random Llama models and brute-force references."""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import torch

from sift_cli.attention.swap import swapped_attention
from sift_cli.bits import n_pages


def tiny_llama(seed=0, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=211, init=0.3, max_pos=4096):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=heads * head_dim, intermediate_size=2 * heads * head_dim, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
                      initializer_range=init, max_position_embeddings=max_pos, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def eager_attentions(model, ids: list[int]) -> list[np.ndarray]:
    """Full softmax matrices [H, S, S] per layer, from the model's own eager attention."""
    with swapped_attention(model, "eager"):
        out = model(torch.tensor([ids]), output_attentions=True, use_cache=False)
    return [a[0].double().numpy() for a in out.attentions]


def brute_force_bits(attn: np.ndarray, prefix_len: int, n_doc: int, tile: int, alpha: float, beta: float,
                     gamma: float, window: int | None = None):
    """SPEC §3 straight from a full probability matrix [H, S, S]: (LA bool [H, P, P], CA bool [H, P]). window:
    the layer's sliding window (a query sees the keys i - window < j <= i)."""
    P = n_pages(n_doc, tile)
    A = attn[:, prefix_len: prefix_len + n_doc, prefix_len: prefix_len + n_doc]
    H = A.shape[0]
    causal = np.tril(np.ones((n_doc, n_doc), dtype=bool))
    if window is not None:
        causal &= np.triu(np.ones((n_doc, n_doc), dtype=bool), 1 - window)
    high = (A >= alpha) & causal[None]
    la = np.zeros((H, P, P), dtype=bool)
    for r in range(P):
        for c in range(r + 1):
            la[:, r, c] = (r == c) | high[:, r * tile:(r + 1) * tile, c * tile:(c + 1) * tile].any(axis=(1, 2))
    counts = ((A >= beta) & causal[None]).sum(1)
    hot = counts / causal.sum(0)[None] > gamma  # over the queries that see each key
    ca = np.zeros((H, P), dtype=bool)
    for p in range(P):
        ca[:, p] = hot[:, p * tile:(p + 1) * tile].any(1)
    return la, ca


def threshold_margin(attn: np.ndarray, prefix_len: int, n_doc: int, alpha: float) -> float:
    """Smallest relative distance of any doc×doc probability from alpha (to tell rounding ties from bugs)."""
    A = attn[:, prefix_len: prefix_len + n_doc, prefix_len: prefix_len + n_doc]
    return float(np.abs(A - alpha).min() / alpha)


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "Sphinx of black quartz, judge my vow. How vexingly quick daft zebras jump!",
    "Retrieval augmented generation prepends documents to a question before the model answers it.",
    "Attention scores concentrate on a few keys: the first token, punctuation and nearby words.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}-_/\\ \n\t",
]


def tiny_checkpoint(directory, seed=0, layers=2, heads=4, kv_heads=2, head_dim=16, max_pos=4096):
    """A real on-disk Hugging Face checkpoint: a BPE tokenizer trained here and a tiny random Llama."""
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAINING_TEXT * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<unk>", pad_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    model = tiny_llama(seed=seed, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                       vocab=len(fast), max_pos=max_pos)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    model.save_pretrained(directory)
    return directory


@contextlib.contextmanager
def command_line(*args):
    """sys.argv as `sift ARGS…` for the length of the block."""
    old = sys.argv
    sys.argv = ["sift", *map(str, args)]
    try:
        yield
    finally:
        sys.argv = old
