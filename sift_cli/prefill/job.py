"""`sift prefill` and `sift demo-prefill` as jobs: options checked, shard sets opened and the model loaded, the
prompt assembled (documents by id or as text), the report of `report.run_prefill`, and with `profile_missing`
the documents no set holds profiled for the next prompt."""

from __future__ import annotations

from pathlib import Path

from ..config import rule_of
from ..corpus import Document
from ..errors import SiftError, error_line
from ..models import load_model
from ..output_dirs import disk_full_error, is_disk_full
from ..sample import SAMPLE_QUESTIONS
from .assemble import assemble
from .checks import check_ids_held, check_prefill_inputs
from .layer_progress import layer_progress
from .lookup import open_set
from .missing import check_destination, profile_dense_documents
from .options import PrefillOptions, forward_count
from .report import run_prefill


def prefill_from_shards(shards_dir: str | Path, docs: list[str | Document], query: str, model: str | None = None,
                        device: str | None = "auto", dtype: str | None = "auto", opts: PrefillOptions = PrefillOptions(),
                        trust_remote_code: bool = False, online: bool = False, progress=None,
                        profile_missing: str | Path | None = None) -> dict:
    """`sift prefill`: the prompt of `docs` (ids, or texts: `corpus.Document`) and `query` from a shard set, dense
    and SIFT side by side. Documents without bits are dense; with `profile_missing`, the prompt also reads that
    set, and afterwards the documents no set holds are profiled into it for the next prompt. The report's "store"
    says how the sets were read (their serving store, or Parquet files with a hint to build it) and what opening
    them cost, apart from SIFT's TTFT (which counts the lookup of the prompt's bits in the open sets)."""
    sets, opened = check_prefill_inputs(shards_dir, docs, opts, device, profile_missing)  # before the model loads
    lm = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, online=online)
    if profile_missing is not None:
        check_destination(profile_missing, sets[0], lm)
    prompt = assemble(sets, lm, docs, query)
    with layer_progress(lm, progress, forward_count(opts, lm.device, len(prompt.input_ids))) as per_forward:
        report = run_prefill(lm, prompt, opts, progress=per_forward)
    report["selection"] = rule_of(sets[0].meta)  # every set of a prompt holds one kind of bits (`lookup`)
    report["store"] = opened
    if profile_missing is not None:
        report["profiled_missing"] = _profile_missing(prompt, lm, profile_missing, sets[0])
    return report


def _profile_missing(prompt, lm, out, first) -> dict:
    """Profile the prompt's dense documents into `out`; a failure is reported with the prefill's report
    ({"error": its line, "out"}), not instead of it: the prefill's result is not thrown away."""
    try:
        return profile_dense_documents(prompt, lm, out, first).to_json()
    except (SiftError, OSError) as exc:
        line = error_line(disk_full_error(exc, out) if is_disk_full(exc) else exc)
        return {"out": str(out), "error": line}


def sample_prefills(shards_dir: str | Path, device: str | None = "auto", n: int = 2, progress=None) -> list[dict]:
    """`sift demo-prefill`: the first `n` built-in sample questions (`sample.SAMPLE_QUESTIONS`) over shards of the
    built-in sample corpus, full recompute and SIFT side by side, with the bundled model. Each report also holds
    "question" and "expected" (the module that answers it). Timing follows the device's defaults
    (`timing.timing_defaults`): the warm median of 3 runs on a GPU; on a CPU the ~2K-token prompts run once per mode
    and print no speed-up (saying how to get one), since the warm median's six more forwards would add about a
    minute to `make demo` for a speed-up that on a CPU means little (docs/cli.md, "Timing")."""
    shards = open_set(shards_dir)
    for q in SAMPLE_QUESTIONS[:n]:  # before the model loads
        check_ids_held([shards], list(q.doc_ids))
    lm = load_model(None, device=device)
    reports = []
    for q in SAMPLE_QUESTIONS[:n]:
        prompt = assemble(shards, lm, list(q.doc_ids), q.question)
        opts = PrefillOptions(max_new_tokens=q.max_new_tokens)
        with layer_progress(lm, progress, forward_count(opts, lm.device, len(prompt.input_ids))) as per_forward:
            report = run_prefill(lm, prompt, opts, progress=per_forward)
        reports.append({**report, "question": q.question, "expected": q.answer})
    return reports
