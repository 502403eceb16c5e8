"""What a prefill report says beside the timings: SIFT's logits against full recompute's (first token, KL), the
densities computed (blocks, cells, cells over allowed, the dense documents' share) and the greedy answers."""

from __future__ import annotations

import torch

from .attention.base import BlockLists
from .block_lists import cell_density, cells_of_documents, cells_over_allowed, computed_cells
from .layout import PromptBits
from .models import LoadedModel


def compare_logits(dense: torch.Tensor, sparse: torch.Tensor) -> dict:
    logp = torch.log_softmax(dense.double(), -1)
    logq = torch.log_softmax(sparse.double(), -1)
    kl = float((logp.exp() * (logp - logq)).sum())
    return {"first_token_match": int(dense.argmax()) == int(sparse.argmax()),
            "max_abs_logit_diff": float((dense - sparse).abs().max()), "kl": max(kl, 0.0),
            "dense_first_token": int(dense.argmax()), "sift_first_token": int(sparse.argmax())}


def density_report(block_lists: list[BlockLists], bits: PromptBits | None = None) -> dict:
    counted = [computed_cells(b) for b in block_lists]  # each layer's computed cells, counted once
    per_layer = [{"layer": i, "blocks": b.density(), "cells": cell_density(b, c)}
                 for i, (b, c) in enumerate(zip(block_lists, counted))]
    computed = sum(b.computed_blocks() for b in block_lists)
    causal = sum(b.causal_blocks() for b in block_lists)
    report = {"blocks": computed / causal, "cells": sum(r["cells"] for r in per_layer) / len(per_layer),
              "computed_blocks": computed, "causal_blocks": causal, "per_layer": per_layer}
    if bits is not None:
        bits = bits.to(block_lists[0].offsets.device)
        report["cells_over_allowed"] = cells_over_allowed(bits, block_lists, counted)
        dense = bits.dense_docs()
        if dense:  # what the documents without bits cost: their share of the computed cells
            report["dense_docs_cells_share"] = (sum(cells_of_documents(b, bits, dense) for b in block_lists)
                                                / max(1, sum(counted)))
    return report


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
