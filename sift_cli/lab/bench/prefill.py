"""`sift bench prefill` (paper Figs. 3, 14, 15 and Table 2): TTFT of full recompute, SIFT and CacheBlend, split
into attention / projections+MLP / metadata decode / metadata transfer, with GPU energy from NVML. The prompts and
their bits: `prefill_cases.py`; one length's modes: `prefill_case_run.py`; the stand-ins and timing:
`prefill_timing.py`; the energy meter: `energy.py`; CacheBlend's streamed KV: `host_kv.py`.

One protocol per run, stated in each row (`protocol`, and `baseline_protocol`: how the full and no-attention runs
its ratios divide by were timed): "eager" (every mode's forward launched eagerly) or, with `cuda_graphs`,
"graphed" (full recompute, no-attention and SIFT, decode included, each captured once per prompt and its replays
timed; `capture_ms` apart). Full and no-attention are timed interleaved run by run, SIFT right after, all warm;
each mode's energy comes from the same callable as its time. CacheBlend is not captured (its KV streams from host
memory on a side stream): it is measured in eager runs only.

Modes and their split
- `full`: the model's own forward, SDPA pinned to cuDNN (falls back, and says so, when cuDNN refuses);
- `no-attention`: the same forward with attention replaced by a free identity — the projections+MLP time
  (everything but attention); `attention_ms = TTFT − no-attention` for the other modes;
- `sift-<backend>`: metadata transfer (bit vectors host→GPU), decode (bits → CSR lists over the prompt's
  document-aligned block table, plus the backend's own preparation), and the forward with block-sparse
  attention. Two ideals: `ideal_ms`, full TTFT minus the share of full attention time the bits skip (1 − the
  density of the pairs the bits allow, `allowed_density`): a perfect kernel on perfect blocks; and
  `ideal_computed_ms`, the same at the density of the cells our blocks compute (`cell_density`), which leaves
  out what block geometry costs. `cells_over_allowed` (SPEC §6's fidelity measure) is their ratio of densities;
- in the graphed protocol each graph copies the prompt's ids (SIFT's also its bits) from pinned memory each replay
  restages first, so `transfer_ms` is SIFT's host staging, already in each replay's TTFT;
- `cacheblend`: the blended forward of `eval.kvreuse` (layer 0 full, ~15% of tokens from layer 1 on; the released
  code's bottom-right mask, which is what its fast kernel computes), reused KV streamed per layer from pinned host
  memory on a side stream (pipelined, as CacheBlend loads layer l+1 while computing layer l); `compute_ms` is the
  same forward with the KV already on the GPU; `ssd_model_ms` adds a *modelled* disk read per layer at
  `ssd_gbps` (paper: 3.8 GB/s effective), overlapped with compute.
"""

from __future__ import annotations

import gc
import time

import torch

from ...errors import SiftError, error_line
from ...models import load_model
from .host_kv import HostKV
from .prefill_case_run import CaseRun
from .prefill_cases import (CPU_SMOKE_LLAMA, Case, corpus_cases, essay_token_docs, llama3_8b_shaped, llama_cases,
                            real_profiles, smol_cases)

LENGTHS = (8192, 16384, 32768, 65536)


@torch.inference_mode()
def run_case(case: Case, modes=("full", "sift", "cacheblend"), backends=("auto",), repeat: int = 3,
             warmup: int = 1, energy: bool = True, block_ms=(None,), block_n: int = 64, ratio: float = 0.15,
             ssd_gbps: float = 3.8, host_kv: HostKV | None = None, dense_kernel: str = "cudnn",
             log=print, baseline: tuple[float, float] | None = None, cuda_graphs: bool = False,
             query_blocks: str = "auto") -> list[dict]:
    """Rows (one per mode) for one prompt length. block_ms: SIFT's query block rows (None: the backend's), one
    SIFT row per backend and size (labelled `@m<rows>` when there are several). baseline: (full ms, no-attention
    ms) measured earlier on the same model and length — full recompute is then not re-run."""
    run = CaseRun(case, repeat, warmup, energy, block_ms[0], block_n, ratio, ssd_gbps, log, cuda_graphs=cuda_graphs,
                  query_blocks=query_blocks)
    if baseline is not None:  # (full, rest[, the protocol they were timed in])
        run.full, run.rest = baseline[:2]
        run.baseline_protocol = baseline[2] if len(baseline) > 2 else None
    else:
        run.full_recompute(dense_kernel)
    if "sift" in modes:
        for bname in backends:
            for bm in block_ms:
                label = f"@m{bm}" if len(block_ms) > 1 else ""
                try:
                    run.sift(bname, bm, label)
                except Exception as exc:  # one backend failing (e.g. out of memory) must not lose the rest
                    run.error_row(f"sift-{bname}{label}", exc)
    if "cacheblend" in modes:
        try:
            run.cacheblend(host_kv)
        except Exception as exc:
            run.error_row("cacheblend", exc)
    return run.rows


# ---- drivers ---------------------------------------------------------------------------------------------------

def require_gpu(cpu_smoke: bool) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if cpu_smoke:
        return torch.device("cpu")
    raise SiftError("bench prefill times GPU prefill: no CUDA GPU is visible here. Run it on a GPU machine; "
                    "--cpu-smoke runs a tiny functional pass whose timings mean nothing")


def summarize_rows(rows: list[dict]) -> list[dict]:
    """Compact table rows: per (model, pattern, tokens) the TTFT of each mode and SIFT's speed-up / ideal."""
    out = {}
    for r in rows:
        key = (r["model"], r["pattern"], r["tokens"])
        e = out.setdefault(key, {"model": r["model"], "pattern": r["pattern"], "tokens": r["tokens"],
                                 "protocol": r.get("protocol")})
        if "error" in r:
            e[r["mode"]] = f"error: {r['error'][:60]}"
            continue
        e[r["mode"]] = round(r["ttft_ms"], 2)
        if r["mode"] == "full":
            e["attention_share"] = r.get("attention_share")
        if r["mode"].startswith("sift"):
            e[f"{r['mode']}_speedup"] = r.get("speedup")
            e[f"{r['mode']}_over_ideal"] = r.get("ttft_over_ideal")
            e[f"{r['mode']}_over_ideal_computed"] = r.get("ttft_over_ideal_computed")
            e["cell_density"] = r.get("cell_density")
            e["cells_over_allowed"] = r.get("cells_over_allowed")
    return list(out.values())


def _run_cases(cases, emit, out_of_time, log, host_kv_for=None, empty_cache: bool = False, **case_kw) -> None:
    """Every case of one model: skipped once the time budget is spent, or when the last case's time scaled to this
    one's length (by the length ratio to the power 1.8: attention grows with its square) would overrun it
    (out_of_time(seconds needed)); a failing case is a row, not an end. host_kv_for(case): CacheBlend's reused KV
    for the case (None: made per case); empty_cache: free the GPU's cached blocks after each case."""
    last = None  # (tokens, seconds) of the last case run
    for case in cases:
        n = len(case.input_ids)
        need = 0.0 if last is None else last[1] * (n / last[0]) ** 1.8
        if out_of_time(need):
            emit([{"model": case.label, "pattern": case.pattern, "tokens": n, "mode": "all",
                   "error": "skipped: time budget"}])
            continue
        t0 = time.perf_counter()
        host_kv = host_kv_for(case) if host_kv_for else None
        try:
            emit(run_case(case, host_kv=host_kv, log=log, **case_kw))
        except Exception as exc:  # one case failing must not lose the others
            emit([{"model": case.label, "pattern": case.pattern, "tokens": n, "mode": "all",
                   "error": error_line(exc, 200)}])
            log(f"  case {n} failed: {exc}")
        last = (n, time.perf_counter() - t0)
        if empty_cache:
            torch.cuda.empty_cache()


def run_bench(models=("llama3-8b",), lengths=LENGTHS, pattern: str = "paper",
              doc_tokens: int | tuple[int, int] = (300, 3000), modes=("full", "sift", "cacheblend"), backends=("auto",),
              repeat: int = 3, warmup: int = 1, energy: bool = True, ratio: float = 0.15, ssd_gbps: float = 3.8,
              data=None, smol_model: str | None = None, cpu_smoke: bool = False, deadline: float | None = None,
              log=print, on_rows=None, cuda_graphs: bool = False, query_blocks: str = "auto",
              unprofiled: int = 0, block_ms=(None,), corpus_docs: int = 0, corpus_dir=None) -> list[dict]:
    """Every (model, length) case; rows of `run_case`. models: 'llama3-8b' (the 8B-shaped model with `pattern`
    bits) and/or 'smollm2' (real profiles; `smol_model` is a --model spec, default the bundled GGUF). unprofiled:
    documents per 8B-shaped prompt without bits (dense). corpus_docs: the 8B-shaped prompts' documents and bits come
    from a shard set of that many documents (built in `corpus_dir`, or reused from there), SIFT's bits looked up in
    its serving store inside each timed prefill."""
    device = require_gpu(cpu_smoke)
    rows: list[dict] = []
    case_kw = dict(modes=modes, backends=backends, repeat=repeat, warmup=warmup, energy=energy, ratio=ratio,
                   ssd_gbps=ssd_gbps, cuda_graphs=cuda_graphs, query_blocks=query_blocks, block_ms=tuple(block_ms))
    longest_doc = doc_tokens[1] if isinstance(doc_tokens, tuple) else doc_tokens

    def emit(new):
        rows.extend(new)
        if on_rows:
            on_rows(new)

    def out_of_time(need: float = 0.0):
        return deadline is not None and time.perf_counter() + need > deadline

    smol = None

    def load_smol():
        nonlocal smol
        if smol is None:
            smol = load_model(smol_model, device=str(device))
        return smol

    sources = None
    for name in models:
        if name in ("llama3-8b", "llama"):
            if pattern == "sampled" and sources is None:
                sources = real_profiles(load_smol(), essay_token_docs(load_smol(), data, longest_doc, 16))[1]
            held: dict = {}

            def host_kv_for(case):  # one pinned buffer for every length of this model, made on first use
                if "cacheblend" in modes and "kv" not in held:
                    cfg = case.lm.model.config
                    held["kv"] = HostKV(cfg.num_hidden_layers, max(lengths), cfg.num_key_value_heads, cfg.head_dim,
                                        case.lm.dtype, pin=device.type == "cuda")
                return held.get("kv")

            if corpus_docs:
                cases = corpus_cases(lengths, *_corpus_set(corpus_docs, corpus_dir, device, cpu_smoke, log))
            else:
                cases = llama_cases(lengths, pattern, doc_tokens, 64, sources, str(device),
                                    CPU_SMOKE_LLAMA if cpu_smoke else None, unprofiled=unprofiled)
            _run_cases(cases, emit, out_of_time, log, host_kv_for, device.type == "cuda", **case_kw)
            del cases, held
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        elif name in ("smollm2", "smol"):
            _run_cases(smol_cases(load_smol(), lengths, data, longest_doc), emit, out_of_time, log, **case_kw)
        else:
            raise SiftError(f"--models {name}: expected llama3-8b or smollm2")
    return rows


def _corpus_set(n_docs: int, corpus_dir, device, cpu_smoke: bool, log) -> tuple:
    """(the set's directory, the 8B-shaped model) for corpus cases: a synthetic set of the model's shape with
    `n_docs` documents of 100–1,500 tokens in `corpus_dir` (built once, with every CPU)."""
    import os
    from pathlib import Path

    from .store_sets import SetShape, build_synthetic_set

    lm = llama3_8b_shaped(str(device), torch.bfloat16 if device.type == "cuda" else torch.float32,
                          CPU_SMOKE_LLAMA if cpu_smoke else None)
    cfg = lm.model.config
    shape = SetShape(f"{lm.name} (synthetic bits)", lm.n_layers, lm.n_heads, cfg.num_key_value_heads, lm.head_dim,
                     64, cfg.vocab_size, lm.max_context)
    d = Path(corpus_dir) / f"corpus-{lm.n_layers}x{lm.n_heads}-{n_docs}"
    if not (d / "store" / "set.json").is_file():
        log(f"building a {n_docs:,}-document set of the model's shape in {d}")
        build_synthetic_set(d, n_docs, shape, workers=os.cpu_count() or 1)
    return d, lm


def bench_prefill(models: list[str], lengths: list[int], pattern: str = "paper",
                  doc_tokens: int | tuple[int, int] = (300, 3000), modes=("full", "sift", "cacheblend"),
                  backends=("auto",), repeat: int = 3, warmup: int = 1, energy: bool = True, ratio: float = 0.15,
                  ssd_gbps: float = 3.8, data=None, smol_model: str | None = None, cpu_smoke: bool = False,
                  log=print, cuda_graphs: bool = False, query_blocks: str = "auto", unprofiled: int = 0,
                  block_ms=(None,), corpus_docs: int = 0, corpus_dir=None, deadline: float | None = None,
                  on_rows=None) -> dict:
    """What `sift bench prefill` reports: {rows, summary, cpu_smoke}. cpu_smoke: without a GPU, a tiny functional
    pass (lengths capped at 512, at most two; 128-token documents). corpus_docs: see `run_bench`; without a
    `corpus_dir` the set is built in a temporary folder, removed at the end. deadline (time.perf_counter()):
    lengths not started by then are rows saying so; on_rows(new rows) after each length."""
    require_gpu(cpu_smoke)
    if cpu_smoke:
        lengths = [min(x, 512) for x in lengths][:2]
        doc_tokens = 128
    if corpus_docs and corpus_dir is None:  # a set of our own, removed afterwards
        import shutil
        import tempfile

        corpus_dir = tempfile.mkdtemp(prefix="sift-bench-corpus-")
        try:
            return bench_prefill(models, lengths, pattern, doc_tokens, modes, backends, repeat, warmup, energy, ratio,
                                 ssd_gbps, data, smol_model, cpu_smoke, log, cuda_graphs, query_blocks, unprofiled,
                                 block_ms, corpus_docs, corpus_dir, deadline, on_rows)
        finally:
            shutil.rmtree(corpus_dir, ignore_errors=True)
    rows = run_bench(models, lengths, pattern, doc_tokens, tuple(modes), tuple(backends), repeat, warmup, energy,
                     ratio, ssd_gbps, data, smol_model, cpu_smoke, deadline=deadline, log=log, on_rows=on_rows,
                     cuda_graphs=cuda_graphs, query_blocks=query_blocks, unprofiled=unprofiled, block_ms=block_ms,
                     corpus_docs=corpus_docs, corpus_dir=corpus_dir)
    return {"rows": rows, "summary": summarize_rows(rows), "cpu_smoke": cpu_smoke, "protocol": protocol(cuda_graphs)}


def protocol(cuda_graphs: bool) -> dict:
    """What one run's rows share: how every mode was timed."""
    if cuda_graphs:
        how = ("graphed: full recompute, no-attention and SIFT (decode included) each captured once per prompt as a "
               "CUDA graph, replays timed; CacheBlend not captured, so not measured")
    else:
        how = "eager: every mode's forward launched eagerly"
    return {"timing": "graphed" if cuda_graphs else "eager", "description": how + "; full and no-attention "
            "interleaved run by run, then each SIFT mode and CacheBlend, warm; wall clock from an idle device, "
            "medians; energy from the same callable as the time",
            "ideal": "ideal_ms: full − (1 − allowed_density) × attention (the cells the bits select); "
                     "ideal_computed_ms: the same at cell_density (the cells computed)"}
