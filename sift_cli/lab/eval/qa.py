"""Multi-document QA: SIFT against full recompute, CacheBlend, naive KV reuse and a static sparse pattern.

The records (`qa_records.py`) are profiled once, and every question is answered in every mode from the same prompt
`prefix ‖ ctx_1 ‖ … ‖ ctx_k ‖ suffix`:

- `full`        dense recompute (the model's own SDPA forward);
- `sift`        block-sparse prefill from the stored bits;
- `sink+window` static sinks + sliding window, per layer at SIFT's block density (see `static`);
- `kv-reuse`    per-document KV computed standalone, re-rotated, no recompute; the suffix computed against it;
- `cacheblend`  the same caches, ~15% highest-deviation tokens recomputed from layer 1 on (see `kvreuse`).

Every mode then generates greedily and densely from its own KV cache. Scoring follows lost-in-the-middle: a
generation is correct when some gold answer, SQuAD-normalised (lower case, punctuation and articles removed,
whitespace collapsed), is a substring of the normalised generation. Agreement with `full` is identical generated
tokens; first-token agreement compares the argmax of the prefill logits; KL is KL(full ‖ mode) at the last prompt
position. Beside them, each question's numeric noise floor (`prefill.noise`: full recompute in the reference
precision against the served one, its KL, first token, answer and accuracy) and every mode's KL as a multiple of it.

No time to first token is reported: each question is a new prompt length, so each mode's one run there includes
the kernels' per-shape set-up (cuDNN builds a plan per shape), which compares nothing. Speed is measured warm, per
shape, modes alternating, by `sift bench prefill`.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import string
import time
from pathlib import Path

import torch

from ...attention.integration import prepare_plan, sparse_attention
from ...block_lists import mean_densities
from ...config import resolve_profile_config
from ...errors import SiftError
from ...prefill.generate import greedy_generate
from ...prefill.noise import kl_multiple, reference_run
from ...prefill.options import PrefillOptions
from ...prefill.report import compare_logits
from ...prefill.run import dense_prefill, sparse_prefill
from ..datasets import data_dir as find_data
from ..runs import ModelSpec, ProgressBar, append_result, no_progress, read_results, run_metadata
from .backend import model_backend
from .kvreuse import cacheblend_prefill, inv_freq_of, is_llama_family, kv_reuse_prefill, reused_kv, standalone_kv
from .prompt_sets import PromptSet, PromptSpec, compose, ensure_shards
from .qa_records import build_nq_records, gold_position, read_qa_records, records_prompt_set, sample_records
from .static import matched_block_lists

MODES = ("full", "sift", "sink+window", "kv-reuse", "cacheblend")


# ---- scoring (lost-in-the-middle's best_subspan_em) ------------------------------------------------------------

def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def answer_correct(prediction: str, answers) -> bool:
    pred = normalize_answer(prediction)
    return any(normalize_answer(a) in pred for a in answers if normalize_answer(a))


# ---- answering -------------------------------------------------------------------------------------------------

def _timed_forward_with_block_lists(lm, ids, backend, block_lists):
    dev = lm.device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    plan = prepare_plan(backend, block_lists[0].table, block_lists)
    with torch.inference_mode(), sparse_attention(lm.model, plan):
        out = lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return out.logits[0, -1].float(), out.past_key_values, (time.perf_counter() - t0) * 1e3


def answer_item(lm, shards, spec: PromptSpec, modes, backend, max_new_tokens: int = 16, block_m: int = 128,
                block_n: int = 64, ratio: float = 0.15, check_layer: int = 1, blend_mask: str = "causal",
                noise_floor: bool = True) -> dict:
    """Every mode on one question; returns a plain dict (texts, tokens, metrics per mode, the noise floor)."""
    prompt = compose(shards, lm, spec)
    ids = torch.tensor([prompt.input_ids], device=lm.device)
    tok = lm.tokenizer
    decoder = "cuda" if backend.name == "cuda" else "torch"
    results: dict[str, dict] = {}
    logits: dict[str, torch.Tensor] = {}
    tokens: dict[str, list[int]] = {}
    extra: dict = {}

    def finish(mode, lg, past, ms, **more):  # ms: one cold run's time, not reported (see the module)
        logits[mode] = lg
        tokens[mode] = greedy_generate(lm, lg, past, max_new_tokens)
        results[mode] = {"text": tok.decode(tokens[mode], skip_special_tokens=True), **more}

    dense = dense_prefill(lm, ids)
    d_logits = dense.logits
    finish("full", d_logits, dense.past, dense.timing.wall_ms)
    sift_lists = None
    if "sift" in modes or "sink+window" in modes:
        s = sparse_prefill(lm, prompt, backend, ids, PrefillOptions(block_m=block_m, block_n=block_n), decoder)
        sift_lists = s.plan.block_lists
        dens, blk = mean_densities(sift_lists)
        extra.update(sift_cell_density=dens, sift_block_density=blk)
        if "sift" in modes:
            finish("sift", s.logits, s.past, s.ttft_ms, cell_density=dens, block_density=blk)
        del s
    if "sink+window" in modes:
        block_lists, windows = matched_block_lists(prompt.layout, sift_lists)
        lg, past, ms = _timed_forward_with_block_lists(lm, ids, backend, block_lists)
        dens = mean_densities(block_lists)[0]
        finish("sink+window", lg, past, ms, cell_density=dens, windows=windows)
    if "kv-reuse" in modes or "cacheblend" in modes:
        records = shards.get(list(spec.doc_ids))
        t0 = time.perf_counter()
        prefix_kv, doc_kvs = standalone_kv(lm.model, shards.prefix_token_ids, [r.tokens for r in records])
        extra["standalone_kv_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        keys, values = reused_kv(prefix_kv, doc_kvs, [d.start for d in prompt.layout.docs],
                                 prompt.layout.prefix_len, inv_freq_of(lm.model))
        rotate_ms = (time.perf_counter() - t0) * 1e3
        del prefix_kv, doc_kvs
        suffix = prompt.input_ids[prompt.layout.docs_end:]
        if "kv-reuse" in modes:
            lg, past, ms = kv_reuse_prefill(lm, keys, values, suffix)
            finish("kv-reuse", lg, past, ms + rotate_ms)
        if "cacheblend" in modes:
            lg, past, ms, share = cacheblend_prefill(lm, prompt.input_ids, keys, values, len(suffix), ratio,
                                                     check_layer, blend_mask)
            finish("cacheblend", lg, past, ms + rotate_ms, recomputed_share=share)
    noise = None
    if noise_floor:
        ref_logits, ref_tokens, ref_dtype = reference_run(lm, ids, max_new_tokens)
        cmp = compare_logits(d_logits, ref_logits)
        ref_text = tok.decode(ref_tokens, skip_special_tokens=True)
        noise = {"reference_dtype": ref_dtype, "kl": cmp["kl"], "first_token_same": cmp["first_token_match"],
                 "same_as_full": ref_tokens == tokens["full"], "text": ref_text,
                 "correct": answer_correct(ref_text, spec.answers) if spec.answers else None}
    for mode, r in results.items():
        r["correct"] = answer_correct(r["text"], spec.answers) if spec.answers else None
        cmp = compare_logits(d_logits, logits[mode])
        r["first_token_same"] = cmp["first_token_match"]
        r["kl"] = cmp["kl"]
        r["same_as_full"] = tokens[mode] == tokens["full"]
        if noise is not None:
            r["kl_over_noise"] = kl_multiple(cmp["kl"], noise["kl"])
    return {"question": spec.question, "answers": list(spec.answers), "doc_ids": list(spec.doc_ids),
            "tokens": prompt.layout.seq_len, "n_docs": len(spec.doc_ids), **extra, "modes": results,
            **({"noise_floor": noise} if noise is not None else {})}


def item_key(spec: PromptSpec) -> str:
    return hashlib.sha256(json.dumps([spec.question, list(spec.doc_ids)]).encode()).hexdigest()[:16]


def summarize_qa(items: list[dict], modes) -> dict:
    out = {}
    for mode in modes:
        rows = [it["modes"][mode] for it in items if mode in it["modes"]]
        if not rows:
            continue
        scored = [r["correct"] for r in rows if r["correct"] is not None]
        out[mode] = {
            "n": len(rows),
            "accuracy": sum(scored) / len(scored) if scored else None,
            "agreement_with_full": sum(r["same_as_full"] for r in rows) / len(rows),
            "first_token_agreement": sum(r["first_token_same"] for r in rows) / len(rows),
            "kl_mean": statistics.fmean(r["kl"] for r in rows),
            "kl_median": statistics.median(r["kl"] for r in rows),
        }
        multiples = [r["kl_over_noise"] for r in rows if r.get("kl_over_noise") is not None]
        if multiples:
            out[mode]["kl_over_noise_median"] = statistics.median(multiples)
        dens = [r["cell_density"] for r in rows if "cell_density" in r]
        if dens:
            out[mode]["cell_density_mean"] = statistics.fmean(dens)
        if mode == "cacheblend":
            out[mode]["recomputed_share_mean"] = statistics.fmean(r["recomputed_share"] for r in rows)
    floors = [it["noise_floor"] for it in items if it.get("noise_floor")]
    if floors:
        scored = [f["correct"] for f in floors if f["correct"] is not None]
        out["noise_floor"] = {"reference_dtype": floors[0]["reference_dtype"], "n": len(floors),
                              "accuracy": sum(scored) / len(scored) if scored else None,
                              "agreement_with_full": sum(f["same_as_full"] for f in floors) / len(floors),
                              "first_token_agreement": sum(f["first_token_same"] for f in floors) / len(floors),
                              "kl_mean": statistics.fmean(f["kl"] for f in floors),
                              "kl_median": statistics.median(f["kl"] for f in floors)}
    if "full" in out and "sift" in out and out["full"]["accuracy"] is not None:
        out["sift"]["accuracy_minus_full"] = out["sift"]["accuracy"] - out["full"]["accuracy"]
    return out


def run_qa(lm, shards, pset: PromptSet, modes=MODES, backend=None, max_new_tokens: int = 16, block_m: int = 128,
           block_n: int = 64, ratio: float = 0.15, check_layer: int = 1, blend_mask: str = "causal",
           done: dict | None = None, on_item=None, progress=None, noise_floor: bool = True) -> dict:
    """All prompts of `pset`; `done` maps item_key → an earlier result (resumed runs skip those)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SiftError(f"--modes: unknown mode {unknown[0]!r}; choose from {', '.join(MODES)}")
    if "full" not in modes:
        modes = ("full", *modes)
    backend = backend or model_backend("auto", lm)
    if ("kv-reuse" in modes or "cacheblend" in modes):
        if not is_llama_family(lm.model):
            raise SiftError("kv-reuse / cacheblend need a Llama-family model (q/k/v/o projections + RoPE); "
                            "leave them out with --modes")
    done = dict(done or {})
    items = []
    for i, spec in enumerate(pset.prompts):
        key = item_key(spec)
        if key in done and all(m in done[key]["modes"] for m in modes):
            items.append(done[key])
        else:
            r = answer_item(lm, shards, spec, modes, backend, max_new_tokens, block_m, block_n, ratio, check_layer,
                            blend_mask, noise_floor)
            r["key"] = key
            items.append(r)
            if on_item:
                on_item(r)
        if progress:
            progress(i + 1, len(pset.prompts))
    return {"summary": summarize_qa(items, modes), "items": items, "modes": list(modes),
            "backend": backend.name, "block": [block_m, block_n], "cacheblend": {
                "ratio": ratio, "check_layer": check_layer, "mask": blend_mask,
                "deviation": "sum over KV heads and head_dim of (V_fresh - V_reused)^2 at the check layer"}}


def qa_report(model: ModelSpec, records: Path | None = None, nq: bool = False, sizes=(10,), questions: int = 50,
              gold: str = "random", seed: int = 0, modes=MODES, backend: str = "auto", max_new_tokens: int = 16,
              ratio: float = 0.15, blend_mask: str = "causal", tile: int = 64, alpha: float = 1e-3,
              beta: float = 1e-2, gamma: float = 0.10, block_m: int = 128, block_n: int = 64,
              results: Path | None = None, data_dir=None, work: Path | None = None,
              progress_bar: ProgressBar = no_progress, noise_floor: bool = True,
              selection: dict | None = None) -> dict:
    """`sift eval qa`: every mode on the questions of a records file (or of nq-open-oracle), once per document
    count in `sizes`. results: per-question JSONL, appended as questions finish; a re-run resumes from it."""
    if (records is None) != nq:
        raise SiftError("give a records file, or --nq to build records from nq-open-oracle")
    if blend_mask not in ("causal", "bottom-right"):
        raise SiftError("--blend-mask must be causal or bottom-right")
    if not 0 < ratio <= 1:
        raise SiftError("--recompute-ratio must be in (0, 1]")
    selection = {"tile": tile, **(selection or {"alpha": alpha, "beta": beta, "gamma": gamma})}
    resolve_profile_config("cpu", selection)  # the rule and its parameters are checked before the model loads
    if nq:  # the data (or the records file) is looked for before the model loads
        find_data(data_dir)
    elif not Path(records).is_file():
        raise SiftError(f"QA records file not found: {records} — give a .jsonl of {{question, answers, ctxs}}, or "
                        f"--nq")
    lm = model.load()
    cfg = resolve_profile_config(lm.device, selection).profile
    be = model_backend(backend, lm)
    done = read_results(results)
    runs = []
    for n in sizes:
        if nq:
            recs = build_nq_records(data_dir, n, questions, gold_position(gold), seed)
            name = f"nq-s{seed}-g{gold}-"
        else:
            recs = sample_records(read_qa_records(records), questions, seed)
            name = f"{records.stem}-"
        pset = records_prompt_set(recs, name, n)
        with progress_bar(f"profiling ({n} docs)") as prog:
            sh = ensure_shards(pset, lm, cfg, work / f"n{n}" if work else None, progress=prog)
        with progress_bar(f"answering ({n} docs)") as prog:
            res = run_qa(lm, sh, pset, modes, be, max_new_tokens, block_m, block_n, ratio, 1, blend_mask,
                         done=done, on_item=lambda r: append_result(results, r), progress=prog,
                         noise_floor=noise_floor)
        res["n_docs"] = n
        res["questions"] = len(pset.prompts)
        res["mean_tokens"] = sum(it["tokens"] for it in res["items"]) / max(1, len(res["items"]))
        runs.append(res)
    return {"runs": runs, "modes": list(runs[0]["modes"]) if runs else [], "run": run_metadata(lm),
            "thresholds": cfg.thresholds(), "source": "nq-open-oracle" if nq else str(records)}
