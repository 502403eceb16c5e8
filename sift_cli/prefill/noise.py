"""The numeric noise floor a report holds SIFT's KL against: full recompute of the same prompt in the serving dtype
against full recompute in a reference precision (`reference_dtype`), untimed, with its own greedy answer.

SIFT's KL(full ‖ SIFT) alone says nothing a user can judge; the same prompt's KL(full ‖ full in the reference
precision) is the change that the arithmetic alone makes, so SIFT's KL as a multiple of it is what a report states
(`verdict`: within, near or above the numeric noise; docs/evaluation.md "The noise floor" gives the reasons)."""

from __future__ import annotations

import contextlib

import torch

from ..models import LoadedModel
from .generate import greedy_generate
from .run import run_forward, strongest_sdpa

# SIFT's KL as a multiple of the noise floor: within up to WITHIN, near up to NEAR, above beyond.
WITHIN = 2.0
NEAR = 5.0


def reference_dtype(serving: torch.dtype) -> torch.dtype:
    """The precision the serving dtype is compared against: fp32 for a half-precision model (the noise of serving
    in bf16 or fp16). An fp32 model is compared against bf16 instead (the comparison reversed): fp32 against fp64
    differs by ~1e-12, a floor every change is far above, while the question a user asks — is SIFT's change larger
    than the one serving in bf16 makes? — stays the same."""
    return torch.bfloat16 if serving in (torch.float32, torch.float64) else torch.float32


@contextlib.contextmanager
def parameters_in(model: torch.nn.Module, dtype: torch.dtype):
    """The model's floating-point parameters in `dtype` for the block, restored exactly afterwards (the original
    tensors are kept, not cast back). Buffers stay as they are: rotary frequencies are fp32 in every dtype."""
    kept = []
    try:
        with torch.no_grad():
            for p in model.parameters():
                if p.is_floating_point() and p.dtype != dtype:
                    kept.append((p, p.data))
                    p.data = p.data.to(dtype)
        yield
    finally:
        for p, data in kept:
            p.data = data


@torch.inference_mode()
def reference_run(lm: LoadedModel, ids: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, list[int], str]:
    """Full recompute of `ids` and its greedy answer in the reference precision: (fp32 logits at the last position,
    answer tokens, reference dtype name)."""
    dtype = reference_dtype(lm.dtype)
    with parameters_in(lm.model, dtype):
        logits, past = run_forward(lm, ids, strongest_sdpa(lm.device))
        logits = logits.float()
        tokens = greedy_generate(lm, logits, past, max_new_tokens)
    return logits, tokens, str(dtype).replace("torch.", "")


def kl_multiple(kl: float, noise_kl: float) -> float | None:
    """SIFT's KL over the noise floor's; None when the floor is 0 and SIFT's KL is not (no finite multiple)."""
    if kl <= 0.0:
        return 0.0
    return kl / noise_kl if noise_kl > 0.0 else None


def verdict(multiple: float | None) -> str:
    if multiple is None:
        return "above"
    return "within" if multiple <= WITHIN else "near" if multiple <= NEAR else "above"


def noise_report(noise: dict, sift_kl: float, reference: str, same_answer: bool) -> dict:
    """The report's "noise_floor": the floor's own comparison (`report.compare_logits` of full recompute in the
    serving dtype against the reference), its answer agreement, SIFT's KL as a multiple and the verdict."""
    multiple = kl_multiple(sift_kl, noise["kl"])
    return {"reference_dtype": reference, "kl": noise["kl"], "first_token_match": noise["first_token_match"],
            "max_abs_logit_diff": noise["max_abs_logit_diff"], "same_answer": same_answer,
            "kl_multiple": multiple, "verdict": verdict(multiple), "thresholds": {"within": WITHIN, "near": NEAR}}


def noise_line(floor: dict) -> str:
    """The text report's one line."""
    m = floor["kl_multiple"]
    times = "no finite multiple of" if m is None else f"{m:.1f}× "
    return (f"SIFT's KL is {times}the numeric noise (full recompute {floor['reference_dtype']} vs served: KL "
            f"{floor['kl']:.2e}, first token {'same' if floor['first_token_match'] else 'different'}, answer "
            f"{'same' if floor['same_answer'] else 'different'}): {floor['verdict']} the numeric noise "
            f"(within ≤ {WITHIN:g}×, near ≤ {NEAR:g}×)")
