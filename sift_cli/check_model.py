"""Does sift compute this model's attention exactly? Sparse prefill with every causal block listed must give the
logits of the model's own (eager) forward: the check a user runs on a new model (`sift check-model`).

Tokens are random ids (seeded) so no tokenizer or text is needed; the prompt is longer than the model's smallest
sliding window where it fits in the context, so a windowed layer is exercised.
"""

from __future__ import annotations

import math

import torch

from .attention.backends import get_backend
from .attention.integration import prepare_plan, sparse_attention
from .attention.swap import swapped_attention
from .block_lists import dense_block_lists
from .block_table import BlockTable
from .model_features import features_of
from .models import LoadedModel
from .prefill.noise import parameters_in

FP32_TOLERANCE = 1e-4  # max |Δlogit| in fp32: the bound
# In bf16/fp16 a kernel's different order of summation moves the logits as much as the dtype's rounding does, so
# the bound is derived from that rounding rather than fixed: twice the change that half precision itself makes to
# the model's own forward (its parameters in fp32 against the served dtype), and never below two units in the last
# place of the largest logit.
NOISE_MULTIPLE = 2.0
ULPS = 2


def ulp(x: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype` numbers at magnitude x."""
    if dtype == torch.float32 or x <= 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(x)) - {torch.bfloat16: 7, torch.float16: 10}.get(dtype, 23))


def half_precision_noise(lm: LoadedModel, ids: torch.Tensor, dense: torch.Tensor) -> float | None:
    """max |Δlogit| between the model's eager forward in its dtype and with its parameters in fp32 (None when fp32
    parameters do not fit the device)."""
    try:
        with parameters_in(lm.model, torch.float32), swapped_attention(lm.model, "eager"):
            reference = lm.model(input_ids=ids, use_cache=False).logits.float()
    except torch.OutOfMemoryError:
        return None
    return float((dense - reference).abs().max())


def tolerance_for(lm: LoadedModel, dense: torch.Tensor, noise: float | None) -> float:
    if lm.dtype == torch.float32:
        return FP32_TOLERANCE
    floor = ULPS * ulp(float(dense.abs().max()), lm.dtype)
    return max(floor, NOISE_MULTIPLE * noise) if noise is not None else max(floor, 0.25)


def top_margin(logits: torch.Tensor) -> float:
    top2 = logits.topk(2).values
    return float(top2[0] - top2[1])


def default_length(lm: LoadedModel) -> int:
    """A prompt past the smallest window (plus an awkward remainder), inside the context."""
    windows = [w for w in features_of(lm.model).windows if w is not None]
    length = max(300, 2 * min(windows) + 37) if windows else 300
    return min(length, lm.max_context)


@torch.inference_mode()
def check_model(lm: LoadedModel, backend_name: str = "auto", length: int | None = None, seed: int = 0,
                block_m: int = 64, block_n: int = 64) -> dict:
    """Every-block sparse prefill vs the model's eager forward on `length` random tokens: a dict with the
    features, the backend, max |Δlogit|, the tolerance (in half precision: derived from the model's own rounding
    noise, `half_precision_noise`) and `ok`."""
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
    noise = None if lm.dtype == torch.float32 else half_precision_noise(lm, ids, dense)
    delta = (sparse - dense).abs()
    tolerance = tolerance_for(lm, dense, noise)
    max_delta = float(delta.max())
    first_equal = bool((sparse[0, -1].argmax() == dense[0, -1].argmax()).item())
    # a next token whose two best logits are closer than the tolerance may swap by rounding alone
    first_ok = first_equal or top_margin(dense[0, -1]) <= tolerance
    return {"model": lm.name, "features": feats.as_dict(), "backend": backend.name, "tokens": length,
            "dtype": str(lm.dtype).replace("torch.", ""), "max_abs_dlogit": max_delta,
            "last_token_max_abs_dlogit": float(delta[0, -1].max()), "tolerance": tolerance,
            "half_precision_noise": noise, "first_token_equal": first_equal,
            "ok": max_delta <= tolerance and first_ok}
