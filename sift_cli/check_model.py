"""Does sift compute this model's attention exactly? Sparse prefill with every causal block listed must give the
logits of the model's own (eager) forward: the check a user runs on a new model (`sift check-model`).

Tokens are random ids (seeded) so no tokenizer or text is needed; the prompt is longer than the model's smallest
sliding window where it fits in the context, so a windowed layer is exercised.
"""

from __future__ import annotations

import torch

from .attention.backends import get_backend
from .attention.integration import prepare_plan, sparse_attention
from .attention.swap import swapped_attention
from .block_lists import dense_block_lists
from .block_table import BlockTable
from .model_features import features_of
from .models import LoadedModel

# max |Δlogit| accepted: fp32 is the bound; bf16/fp16 a few units of their rounding on logits of size ~10
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.25, torch.float16: 0.05}


def default_length(lm: LoadedModel) -> int:
    """A prompt past the smallest window (plus an awkward remainder), inside the context."""
    windows = [w for w in features_of(lm.model).windows if w is not None]
    length = max(300, 2 * min(windows) + 37) if windows else 300
    return min(length, lm.max_context)


@torch.inference_mode()
def check_model(lm: LoadedModel, backend_name: str = "auto", length: int | None = None, seed: int = 0,
                block_m: int = 64, block_n: int = 64) -> dict:
    """Every-block sparse prefill vs the model's eager forward on `length` random tokens: a dict with the
    features, the backend, max |Δlogit|, the tolerance and `ok`."""
    feats = features_of(lm.model)
    length = length or default_length(lm)
    backend = get_backend(backend_name, lm.device, feats.for_length(length))
    gen = torch.Generator().manual_seed(seed)
    vocab = lm.model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, length), generator=gen).to(lm.device)
    with swapped_attention(lm.model, "eager"):
        dense = lm.model(input_ids=ids, use_cache=False).logits.float()
    table = BlockTable.causal(length, block_m, block_n, device=lm.device)
    lists = [dense_block_lists(table, feats.n_heads)] * feats.n_layers
    with sparse_attention(lm.model, prepare_plan(backend, table, lists)):
        sparse = lm.model(input_ids=ids, use_cache=False).logits.float()
    delta = (sparse - dense).abs()
    tolerance = TOLERANCE.get(lm.dtype, 1e-4)
    max_delta = float(delta.max())
    return {"model": lm.name, "features": feats.as_dict(), "backend": backend.name, "tokens": length,
            "dtype": str(lm.dtype).replace("torch.", ""), "max_abs_dlogit": max_delta,
            "last_token_max_abs_dlogit": float(delta[0, -1].max()), "tolerance": tolerance,
            "first_token_equal": bool((sparse[0, -1].argmax() == dense[0, -1].argmax()).item()),
            "ok": max_delta <= tolerance}
