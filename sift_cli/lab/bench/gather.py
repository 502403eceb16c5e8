"""`sift bench gather`: the CPU's sparse path (the gather backend) against full recompute at RAG lengths, on real
profiles. For each target length the prompt takes the set's first documents whose tokens come closest to it;
both modes run interleaved (full recompute, then SIFT), warm-ups first, and the row holds the medians, the cells
SIFT computed and whether its first token matched. A speed-up is printed only under the timing rule
(`timing.timing_protocol`)."""

from __future__ import annotations

import statistics

import torch

from ...attention.backends import get_backend
from ...errors import SiftError
from ...models import load_model
from ...prefill.assemble import assemble
from ...prefill.lookup import open_set
from ...prefill.options import PrefillOptions
from ...prefill.report import compare_logits, density_report
from ...prefill.run import dense_prefill, sparse_prefill
from ...timing import timing_protocol

QUESTION = "What do these documents have in common?"


def pick_documents(sizes: dict[str, int], target: int, limit: int | None = None) -> list[str]:
    """The first ids (in order) whose tokens come closest to `target`: at least one, each next one taken while it
    brings the total nearer and keeps it within `limit` (the document tokens the model's context leaves)."""
    picked, total = [], 0
    for doc_id, n in sizes.items():
        if picked and (abs(total + n - target) >= abs(total - target) or (limit is not None and total + n > limit)):
            break
        picked.append(doc_id)
        total += n
    return picked


def run_gather_bench(shards_dir, lengths=(2048, 4096, 6144, 8192), repeat: int = 3, warmup: int = 1,
                     model: str | None = None, log=print) -> dict:
    source = open_set(shards_dir)
    lm = load_model(model, device="cpu")
    backend = get_backend("gather", lm.device)
    opts = PrefillOptions(backend="gather")
    sizes = {b.doc_id: len(b.tokens) for b in source.get(source.doc_ids())}
    if not sizes:
        raise SiftError(f"{shards_dir}: the set holds no profiled documents")
    protocol = timing_protocol(repeat, warmup)
    first = next(iter(sizes))  # the prompt's tokens besides its documents: prefix, question and template
    overhead = len(assemble(source, lm, [first], QUESTION).input_ids) - sizes[first]
    rows, seen = [], set()
    for target in lengths:
        if target > lm.max_context:
            rows.append({"target_tokens": target, "error": f"{target} tokens is more than the model's context of "
                                                           f"{lm.max_context}"})
            continue
        ids = pick_documents(sizes, target, lm.max_context - overhead)
        if tuple(ids) in seen:
            continue  # the set has too few documents for a longer prompt
        seen.add(tuple(ids))
        try:
            prompt = assemble(source, lm, ids, QUESTION)
        except SiftError as e:
            rows.append({"target_tokens": target, "docs": len(ids), "error": str(e)})
            continue
        x = torch.tensor([prompt.input_ids])
        full, sift = [], []
        for i in range(max(0, warmup) + max(1, repeat)):
            d = dense_prefill(lm, x)
            s = sparse_prefill(lm, prompt, backend, x, opts)
            if i >= warmup:
                full.append(d.timing.wall_ms)
                sift.append(s.timing.wall_ms)
            log(f"  {len(prompt.input_ids):>6} tokens  run {i + 1}{' (warm-up)' * (i < warmup)}: "
                f"full {d.timing.wall_ms:,.0f} ms  SIFT {s.timing.wall_ms:,.0f} ms")
        density = density_report(s.plan.block_lists, prompt.bits)
        cmp = compare_logits(d.logits, s.logits)
        f_ms, s_ms = statistics.median(full), statistics.median(sift)
        rows.append({"target_tokens": target, "tokens": len(prompt.input_ids), "docs": len(ids),
                     "cells": density["cells"], "blocks": density["blocks"], "full_ms": f_ms, "sift_ms": s_ms,
                     "full_runs_ms": full, "sift_runs_ms": sift,
                     "speedup": None if protocol["speedup_withheld"] else f_ms / s_ms,
                     "first_token_match": cmp["first_token_match"], "kl": cmp["kl"]})
    return {"model": lm.name, "threads": torch.get_num_threads(), "backend": backend.name,
            "timing": protocol, "rows": rows}
