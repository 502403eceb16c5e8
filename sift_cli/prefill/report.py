"""Full recompute and SIFT on the same prompt, in one process (`run_prefill`): the timings of both, eager or
replayed from CUDA graphs, and what the report says beside them: SIFT's logits against full recompute's (first
token, KL), the densities computed (blocks, cells, cells over allowed, the dense documents' share) and the greedy
answers."""

from __future__ import annotations

import statistics

import torch

from ..attention.backends import get_backend
from ..attention.base import BlockLists
from ..block_lists import cell_density, cells_of_documents, cells_over_allowed, computed_cells
from ..errors import SiftError
from ..timing import timing_protocol
from ..layout import PromptBits
from ..model_features import features_of
from ..models import LoadedModel
from .assemble import Prompt
from .generate import greedy_generate
from .noise import noise_report, reference_run
from .graphs import GraphedPrefill, graphed_sparse_prefill
from .options import PrefillOptions, for_prompt, with_device_defaults
from .plan import choose_decoder
from .run import Timing, dense_prefill, sparse_prefill, timed


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


def _timing_json(runs: list[Timing]) -> dict:
    med = statistics.median
    out = {"ttft_ms": med(t.wall_ms for t in runs), "runs_ms": [t.wall_ms for t in runs],
           "host_ms": med(t.host_ms for t in runs)}
    gpu = [t.gpu_ms for t in runs if t.gpu_ms is not None]
    out["gpu_ms"] = med(gpu) if gpu else None
    return out


def _bound(t: dict) -> str | None:
    """Which side limits the forward: the GPU is idle for part of it when host time ≈ wall time > GPU time."""
    if t.get("gpu_ms") is None:
        return None
    return "host" if t["gpu_ms"] < 0.85 * t["ttft_ms"] else "gpu"


def run_prefill(lm: LoadedModel, prompt: Prompt, opts: PrefillOptions = PrefillOptions(),
                progress=None) -> dict:
    """Dense and SIFT prefill of `prompt`, side by side; returns the report as a plain dict.

    progress: optional callable(done, total) called after every forward. Unset repeat and warmup take the
    device's and the prompt length's defaults (`timing_defaults`); a speed-up is reported only when the timings
    meet the rule of `timing.timing_protocol` (else "speedup" is None and "timing" says why)."""
    backend = get_backend(opts.backend, lm.device, features_of(lm.model).for_length(len(prompt.input_ids)))
    opts = for_prompt(with_device_defaults(opts, lm.device, len(prompt.input_ids)), backend, lm.head_dim, prompt.bits)
    decoder = choose_decoder(lm.device)
    ids = torch.tensor([prompt.input_ids], device=lm.device)
    total = (max(0, opts.warmup) + max(1, opts.repeat)) * 2
    done = 0

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    graphs = None
    if opts.cuda_graphs:
        if lm.device.type != "cuda":
            raise SiftError("--cuda-graphs needs a CUDA device")
        graphs = _graphed_runs(lm, prompt, backend, ids, opts, decoder, tick)
        d_logits, d_past, dense_times, s, sift_times, (lookup_ms, transfer_ms), block_lists = graphs["results"]
        prep_ms = None
    else:
        for _ in range(max(0, opts.warmup)):  # compile / autotune / allocate outside the timed runs
            dense_prefill(lm, ids)
            tick()
            sparse_prefill(lm, prompt, backend, ids, opts, decoder)
            tick()
        dense_times, sift_times, sift_parts = [], [], []
        d = s = None
        for _ in range(max(1, opts.repeat)):
            d = None  # only the last run of each mode is kept (its KV cache answers): no cache piles up
            d = dense_prefill(lm, ids)
            dense_times.append(d.timing)
            tick()
            s = None
            s = sparse_prefill(lm, prompt, backend, ids, opts, decoder)
            sift_times.append(s.timing)
            sift_parts.append((s.lookup_ms, s.transfer_ms, s.prepare_ms, s.forward_ms))
            tick()
        d_logits, d_past = d.logits, d.past
        lookup_ms, transfer_ms, prep_ms, forward_ms = (statistics.median(p) for p in zip(*sift_parts))
        block_lists = s.plan.block_lists
    s_logits, s_past = (s.logits, s.past) if not graphs else s
    dense_t, sift_t = _timing_json(dense_times), _timing_json(sift_times)
    protocol = timing_protocol(opts.repeat, opts.warmup)
    dense_tokens = greedy_generate(lm, d_logits.float(), d_past, opts.max_new_tokens)
    sift_tokens = greedy_generate(lm, s_logits.float(), s_past, opts.max_new_tokens)
    tok = lm.tokenizer
    sift_t.update(lookup_ms=lookup_ms if prompt.source is not None else None, transfer_ms=transfer_ms,
                  decode_ms=prep_ms,
                  forward_ms=None if graphs else forward_ms,
                  text=tok.decode(sift_tokens, skip_special_tokens=True), bound=_bound(sift_t))
    dense_t.update(text=tok.decode(dense_tokens, skip_special_tokens=True), bound=_bound(dense_t))
    report = {
        "model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
        "backend": backend.name, "decoder": decoder, "block_m": opts.block_m, "block_n": opts.block_n,
        "query_blocks": opts.query_blocks, "tile_size": prompt.bits.tile, "doc_ids": prompt.doc_ids,
        "dense_docs": [{"doc_id": d.doc_id, "reason": d.reason, "tokens": d.n_tokens} for d in prompt.dense],
        # no document has bits: SIFT ran full recompute's forward (`run._causal_prefill`)
        "causal_kernel": prompt.bits.without_bits(),
        "prompt_tokens": prompt.segment_tokens(), "cuda_graphs": bool(graphs),
        "density": density_report(block_lists, prompt.bits),
        "dense": dense_t, "sift": sift_t,
        # a speed-up only from the warm median (`timing.timing_protocol`); "timing" says which protocol ran
        "timing": protocol,
        "speedup": (dense_t["ttft_ms"] / sift_t["ttft_ms"]
                    if sift_t["ttft_ms"] > 0 and protocol["speedup_withheld"] is None else None),
        "decode_ms": prep_ms,
        "decode_share_of_ttft": prep_ms / sift_t["ttft_ms"] if prep_ms is not None and sift_t["ttft_ms"] else None,
        "lookup_share_of_ttft": (sift_t["lookup_ms"] / sift_t["ttft_ms"]
                                 if sift_t["lookup_ms"] is not None and sift_t["ttft_ms"] else None),
        "same_answer": dense_tokens == sift_tokens,
        "metadata_bytes": prompt.bits.nbytes(),
        **compare_logits(d_logits.float(), s_logits.float()),
    }
    if opts.noise_floor:
        report["noise_floor"] = _noise_floor(lm, ids, d_logits.float(), dense_tokens, report["kl"], opts)
        report["kl_over_noise"] = report["noise_floor"]["kl_multiple"]
    if graphs:
        report["capture_ms"] = {"dense": graphs["dense_capture_ms"], "sift": graphs["sift_capture_ms"]}
        report["graph_logits_equal_eager"] = graphs["equal_eager"]
    return report


def _noise_floor(lm, ids, dense_logits, dense_tokens, sift_kl, opts) -> dict:
    """Untimed, after the timed runs: full recompute in the reference precision against the served one."""
    ref_logits, ref_tokens, ref_dtype = reference_run(lm, ids, opts.max_new_tokens)
    return noise_report(compare_logits(dense_logits, ref_logits), sift_kl, ref_dtype, ref_tokens == dense_tokens)


def _graphed_runs(lm, prompt, backend, ids, opts, decoder, tick) -> dict:
    """Dense and SIFT each captured once, then replayed `repeat` times; also checks the graph's SIFT logits
    against an eager SIFT prefill of the same prompt (same kernels, same order: they must be equal). SIFT's
    `lookup_ms` is fetching its bits from the prompt's sets and `transfer_ms` the host staging of its ids and bits,
    both already part of each replay's time (full recompute's graph restages its ids the same way)."""
    dense = GraphedPrefill(lm, ids)
    sift = graphed_sparse_prefill(lm, prompt, backend, ids, opts, decoder, max(1, opts.repeat))
    host_ms = (sift.lookup_ms, sift.transfer_ms)
    for _ in range(max(0, opts.warmup)):
        dense.replay()
        tick()
        sift.replay()
        tick()
    dense_times, sift_times = [], []
    for _ in range(max(1, opts.repeat)):
        (d_logits, d_past), t = timed(lm, dense.replay)
        dense_times.append(t)
        tick()
        (s_logits, s_past), t = timed(lm, sift.replay)
        sift_times.append(t)
        tick()
    eager = sparse_prefill(lm, prompt, backend, ids, opts, decoder)
    s_logits = s_logits.float().clone()
    return {"results": (d_logits.float().clone(), d_past, dense_times, (s_logits, s_past), sift_times,
                        host_ms, sift.plan.block_lists),
            "dense_capture_ms": dense.capture_ms, "sift_capture_ms": sift.capture_ms,
            "equal_eager": bool(torch.equal(eager.logits, s_logits))}
