"""Dense greedy generation from the KV cache a prefill wrote (the answers a report compares)."""

from __future__ import annotations

import torch

from ..models import LoadedModel


@torch.inference_mode()
def greedy_generate(lm: LoadedModel, logits: torch.Tensor, past, max_new_tokens: int) -> list[int]:
    """Dense greedy generation from a prefilled KV cache."""
    tokens = []
    eos = lm.model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    for _ in range(max_new_tokens):
        tok = int(logits.argmax())
        tokens.append(tok)
        if tok in eos:
            break
        out = lm.model(input_ids=torch.tensor([[tok]], device=lm.device), past_key_values=past, use_cache=True)
        logits, past = out.logits[0, -1].float(), out.past_key_values
    return tokens
