"""`sift bench profile`: profiling throughput against plain dense prefill of the same model on the same documents,
in one process.

For each case the documents are tokenised once; then

- **dense prefill**: the model's decoder stack (no LM head; attention through transformers' SDPA, bf16 on GPU) on
  `prefix ‖ doc`, in exactly the batches `sift profile` forms (`plan_batches`: length-sorted, right-padded,
  `batch_tokens` per batch), timed with the inputs already on the device;
- **sift profile**: the whole `profile_corpus` run, reading the corpus file, tokenising, profiling and writing
  closed shards with a manifest, once per statistics path (`triton`, `torch`), each after a warm-up run on a
  few documents (Triton compiles, cuDNN/cuBLAS pick kernels).

Both are the fastest of `repeat` runs (default 2), each profile run into an empty directory.

Throughput is document tokens (the prefix excluded, in both) per second. Cases: the bundled SmolLM2 on NQ gold
passages and on the essays (``../shared/data``), and a Llama-3-8B-shaped model (its published config, random bf16
weights: speed does not depend on the weights) on 2K- and 8K-token documents of random token ids.
`run_profile_bench(...)` returns rows (dicts); `render(rows)` builds a rich table.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import pyarrow.parquet as pq
import torch
from rich.table import Table

from ...config import resolve_profile_config
from ...corpus import CorpusFormat, load_documents
from ...errors import SiftError, debug_enabled, error_line
from ...models import load_model
from ...profile.batches import padded_batch, plan_batches
from ...profile.job import profile_corpus
from ...shards.files import list_parts
from ...tokens import prefix_token_ids, tokenize_documents
from ..datasets import data_dir as find_data, essay_records, nq_passages, nq_records, write_jsonl
from .llama import LLAMA3_8B_CONFIG, LLAMA3_8B_NAME, random_llama


def random_id_records(n_docs: int, n_tokens: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"rand{i:05d}", "title": "", "text": " ".join(str(rng.randrange(1000, vocab - 1000))
                                                                 for _ in range(n_tokens))} for i in range(n_docs)]


def nq_case_records(data, n: int) -> list[dict]:
    return nq_passages(nq_records(data))[:n]


def essay_case_records(data, n: int, words: int = 1600) -> list[dict]:
    return essay_records(data, words)[:n]


# ----------------------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------------------

def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def dense_prefill_tok_s(lm, prefix_ids: list[int], docs: list[list[int]], batch_tokens: int,
                        repeat: int = 2) -> float:
    """Document tokens per second of the plain model forward on `prefix ‖ doc`, batched as `sift profile`
    batches them (SDPA attention; no statistics)."""
    base = getattr(lm.model, "model", lm.model)
    batches = []
    for idx in plan_batches([len(d) for d in docs], len(prefix_ids), batch_tokens):
        batches.append(padded_batch(prefix_ids, [docs[i] for i in idx]).to(lm.device))
    base(input_ids=batches[0], use_cache=False)  # warm-up (kernel choice for this shape)
    _sync(lm.device)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for ids in batches:
            base(input_ids=ids, use_cache=False)
        _sync(lm.device)
        times.append(time.perf_counter() - t)
    return sum(len(d) for d in docs) / min(times)


def _profile_run(lm, corpus, out: Path, cfg, fmt, prefix_text, docs_per_shard):
    if out.exists():
        shutil.rmtree(out)
    _sync(lm.device)
    rep = profile_corpus(corpus, out, lm, cfg, fmt, docs_per_shard=docs_per_shard, prefix_text=prefix_text)
    _sync(lm.device)
    return rep


def _shard_digest(out: Path) -> dict[str, str]:
    """doc_id → hash of its (la_bits, ca_bits), over every shard of a directory."""
    digests = {}
    for p in list_parts(out):
        t = pq.read_table(p, columns=["doc_id", "la_bits", "ca_bits"]).to_pydict()
        for d, la, ca in zip(t["doc_id"], t["la_bits"], t["ca_bits"]):
            digests[d] = hashlib.sha256(la + b"|" + ca).hexdigest()
    return digests


def bench_case(lm, model_name: str, case: str, records: list[dict], work: Path, stats_paths=("triton", "torch"),
               batch_tokens: int = 65536, fmt=None, prefix_text: str | None = None, docs_per_shard: int = 1000,
               repeat: int = 2, log=print) -> dict:
    """One row: dense prefill and the whole profile run with each statistics path, on the same documents."""
    fmt = fmt or CorpusFormat()
    corpus = write_jsonl(records, work / f"{case}.jsonl")
    warm = write_jsonl(records[: max(1, min(4, len(records) // 4))], work / f"{case}-warm.jsonl")
    prefix = prefix_token_ids(lm.tokenizer, prefix_text)
    docs = tokenize_documents(lm.tokenizer, load_documents(corpus, fmt))
    limit = lm.max_context - len(prefix)
    docs = [d for d in docs if len(d) <= limit]
    row = {"model": model_name, "case": case, "docs": len(docs), "tokens": sum(map(len, docs)),
           "mean_tokens": statistics.fmean(map(len, docs)) if docs else 0.0, "device": str(lm.device),
           "dtype": str(lm.dtype).replace("torch.", ""), "batch_tokens": batch_tokens}
    row["dense_tok_s"] = dense_prefill_tok_s(lm, prefix, docs, batch_tokens, repeat)
    log(f"  {model_name} / {case}: dense prefill {row['dense_tok_s']:,.0f} tok/s over {row['docs']} docs")
    digests = {}
    for stats in stats_paths:
        cfg = resolve_profile_config(lm.device, {"batch_tokens": batch_tokens, "stats": stats}).profile
        try:
            _profile_run(lm, warm, work / f"{case}-{stats}-warm", cfg, fmt, prefix_text, docs_per_shard)
            # the fastest of `repeat` whole runs, as for dense (each run starts from an empty directory)
            rep = min((_profile_run(lm, corpus, work / f"{case}-{stats}", cfg, fmt, prefix_text, docs_per_shard)
                       for _ in range(max(1, repeat))), key=lambda r: r.seconds)
            row[f"profile_{stats}_tok_s"] = rep.tokens_per_second
            row[f"profile_{stats}_s"] = rep.seconds
            row[f"ratio_{stats}"] = rep.tokens_per_second / row["dense_tok_s"] if row["dense_tok_s"] else None
            digests[stats] = _shard_digest(work / f"{case}-{stats}")
            log(f"  {model_name} / {case}: profile ({stats}) {rep.tokens_per_second:,.0f} tok/s "
                f"= {row[f'ratio_{stats}']:.2f} of dense, {rep.shards_written} shards in {rep.seconds:.1f} s")
        except Exception as exc:  # report and go on with the other paths and cases
            row[f"profile_{stats}_error"] = error_line(exc, 300)
            log(f"  {model_name} / {case}: profile ({stats}) FAILED: {row[f'profile_{stats}_error']}")
            _debug_traceback()
    if len(digests) >= 2:
        a, b = list(digests.values())[:2]
        row["docs_same_bits"] = sum(a[d] == b.get(d) for d in a)
        row["docs_compared"] = len(a)
    return row


def run_profile_bench(smol=None, data_dir=None, device: str = "cuda", quick: bool = False,
                      stats_paths=("triton", "torch"), nq_docs: int | None = None, essay_docs: int | None = None,
                      llama_docs: dict | None = None, cases: tuple[str, ...] = ("nq", "essays", "8b-2k", "8b-8k"),
                      work_dir=None, log=print, llama=None, llama_config: dict | None = None) -> list[dict]:
    """All cases; a failing case becomes a row with an 'error'. smol: a LoadedModel of SmolLM2 (default: load
    the bundled one). llama: a LoadedModel from `random_llama` to reuse (default: built here from
    `llama_config`, default Llama-3-8B's). llama_docs: documents per 8B case, e.g. {"8b-2k": 16, "8b-8k": 4}.

    What can be checked first is (raising SiftError: one line, exit 2): the cases' names, the device (a CUDA GPU
    unless device is cpu), the data of the SmolLM2 cases. A case that fails later becomes a row with its error
    (one line; SIFT_DEBUG=1 prints the traceback)."""
    unknown = [c for c in cases if c not in ("nq", "essays", "8b-2k", "8b-8k")]
    if unknown:
        raise SiftError(f"--cases {','.join(unknown)}: unknown — choose among nq, essays, 8b-2k, 8b-8k")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise SiftError("sift bench profile measures GPU profiling: no CUDA GPU is visible here — run it on a GPU "
                        "machine, or pass --device cpu for a (slow) CPU measurement")
    data = find_data(data_dir) if {"nq", "essays"} & set(cases) else None
    if work_dir:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    # a folder of this run's own (inside --work-dir when given): the only thing it deletes, when it ends
    work = Path(tempfile.mkdtemp(prefix="sift-bench-profile-", dir=work_dir))
    try:
        return _run_cases(smol, data, device, quick, stats_paths, nq_docs, essay_docs, llama_docs, cases, work, log,
                          llama, llama_config)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_cases(smol, data, device, quick, stats_paths, nq_docs, essay_docs, llama_docs, cases, work, log, llama,
               llama_config) -> list[dict]:
    rows: list[dict] = []
    nq_docs = nq_docs or (200 if quick else 1000)
    essay_docs = essay_docs or (8 if quick else 50)
    llama_docs = {"8b-2k": 4 if quick else 16, "8b-8k": 1 if quick else 4, **(llama_docs or {})}

    def attempt(model_name, case, make_records, lm, **kw):
        try:
            rows.append(bench_case(lm, model_name, case, make_records(), work, stats_paths=stats_paths, log=log,
                                   **kw))
        except Exception as exc:
            _debug_traceback()
            rows.append({"model": model_name, "case": case, "error": error_line(exc, 300)})

    if {"nq", "essays"} & set(cases):
        try:
            if smol is None:
                smol = load_model(None, device=device)
            name = "SmolLM2-135M-Instruct"
            if "nq" in cases:
                attempt(name, "NQ passages", lambda: nq_case_records(data, nq_docs), smol)
            if "essays" in cases:
                attempt(name, "essays", lambda: essay_case_records(data, essay_docs), smol)
        except Exception as exc:
            _debug_traceback()
            rows.append({"model": "SmolLM2-135M-Instruct", "case": "NQ passages / essays",
                         "error": error_line(exc, 300)})
    llama_cases = [c for c in ("8b-2k", "8b-8k") if c in cases]
    if llama_cases:
        conf = llama_config or LLAMA3_8B_CONFIG
        lm = llama
        try:
            smol = None  # free the small model's memory before building 16 GB of weights
            if lm is None:
                lm = random_llama(llama_config, device=device)
            prefix = [conf["bos_token_id"]]
            for case in llama_cases:
                n_tok = min(2048, conf["max_position_embeddings"] // 4) if case == "8b-2k" else \
                    conf["max_position_embeddings"] - len(prefix)
                attempt(lm.name, f"{n_tok}-token random docs",
                        lambda n_tok=n_tok, case=case: random_id_records(llama_docs[case], n_tok, conf["vocab_size"]),
                        lm, fmt=CorpusFormat(template="{text}"), prefix_text="", repeat=1)
        except Exception as exc:
            _debug_traceback()
            rows.append({"model": LLAMA3_8B_NAME, "case": ", ".join(llama_cases), "error": error_line(exc, 300)})
        finally:
            if llama is None:
                del lm
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    return rows


def _debug_traceback() -> None:
    if debug_enabled():
        traceback.print_exc()


def failures(rows: list[dict]) -> list[str]:
    """One line per case or statistics path that failed."""
    out = []
    for r in rows:
        where = f"{r.get('model', '')} / {r.get('case', '')}"
        if "error" in r:
            out.append(f"{where}: {r['error']}")
        out.extend(f"{where} ({p}): {r[f'profile_{p}_error']}" for p in ("triton", "torch")
                   if f"profile_{p}_error" in r)
    return out


# ----------------------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------------------

def _fmt_rate(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def render(rows: list[dict]):
    """A rich table: dense prefill and profile throughput side by side."""
    paths = [p for p in ("triton", "torch") if any(f"profile_{p}_tok_s" in r or f"profile_{p}_error" in r
                                                   for r in rows)]
    table = Table(title="sift profile vs dense prefill (document tokens/s, same documents, one process)",
                  show_edge=False)
    for col in ("model", "documents", "docs", "mean tok", "dense prefill"):
        table.add_column(col, justify="left" if col in ("model", "documents") else "right")
    for p in paths:
        table.add_column(f"profile ({p})", justify="right")
        table.add_column("÷ dense", justify="right")
    table.add_column("same bits", justify="right")
    for r in rows:
        if "error" in r:  # the error itself is listed under the table (`failures`)
            table.add_row(r.get("model", ""), r.get("case", ""), "", "", "[red]failed[/]", *[""] * (2 * len(paths) + 1))
            continue
        cells = [r["model"], r["case"], str(r["docs"]), f"{r['mean_tokens']:.0f}", _fmt_rate(r["dense_tok_s"])]
        for p in paths:
            if f"profile_{p}_error" in r:
                cells += ["[red]failed[/]", ""]
            else:
                ratio = r.get(f"ratio_{p}")
                cells += [_fmt_rate(r.get(f"profile_{p}_tok_s")), "-" if ratio is None else f"{ratio:.2f}"]
        cells.append(f"{r['docs_same_bits']}/{r['docs_compared']}" if "docs_compared" in r else "-")
        table.add_row(*cells)
    return table


def plain_table(rows: list[dict]) -> str:
    """The same as `render`, as plain text lines (for logs and the GPU run script)."""
    lines = []
    for r in rows:
        if "error" in r:
            lines.append(f"{r.get('model', '')} | {r.get('case', '')} | ERROR {r['error']}")
            continue
        parts = [f"{r['model']} | {r['case']} | {r['docs']} docs x {r['mean_tokens']:.0f} tok",
                 f"dense {_fmt_rate(r['dense_tok_s'])} tok/s"]
        for p in ("triton", "torch"):
            if f"profile_{p}_tok_s" in r:
                parts.append(f"{p} {_fmt_rate(r[f'profile_{p}_tok_s'])} tok/s ({r[f'ratio_{p}']:.2f}x dense)")
            elif f"profile_{p}_error" in r:
                parts.append(f"{p} FAILED {r[f'profile_{p}_error'][:80]}")
        if "docs_compared" in r:
            parts.append(f"same bits {r['docs_same_bits']}/{r['docs_compared']}")
        lines.append(" | ".join(parts))
    return "\n".join(lines)


def to_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=2)
