"""`sift eval …`, `sift calibrate` and `sift bench prefill`: parse, call `sift_cli.eval` / `sift_cli.bench.prefill`,
render with rich or JSON. Mounted by cli.py:

    from .cli_eval import bench_prefill, calibrate, eval_app
    app.add_typer(eval_app, name="eval")
    app.command("calibrate")(calibrate)
    bench_app.command("prefill")(bench_prefill)     # beside `bench kernels`
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .console import err, human_bytes, out, pct, print_json
from .errors import SiftError

eval_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                       pretty_exceptions_enable=False,
                       help="Reproduce the paper's measurements on your model and corpus: recall, QA accuracy against "
                            "full recompute and CacheBlend, threshold sweeps, storage.")

ModelOpt = typer.Option(None, "--model", help="HF model id (offline cache), local directory or .gguf file; "
                                              "default: the bundled SmolLM2-135M-Instruct GGUF")
DeviceOpt = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto")
DtypeOpt = typer.Option("auto", "--dtype", help="model dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16")
JsonOpt = typer.Option(False, "--json", help="print one JSON object on stdout")
PlotOpt = typer.Option(None, "--plot", help="write a figure to this .png (needs matplotlib)")
DataOpt = typer.Option(None, "--data-dir", help="folder with nq-open-oracle.jsonl.gz and paul-graham-essays/ "
                                                "(default: $SIFT_DATA_DIR or ../shared/data)")
WorkOpt = typer.Option(None, "--work", help="work directory for the profiled documents (default: under the sift cache)")
ThreadsOpt = typer.Option(0, "--threads", help="CPU threads for torch (0: torch's default; 1 is faster on a busy "
                                               "machine)")
BackendOpt = typer.Option("auto", "--backend", help="auto, reference, flex or cuda")


# ---- helpers ---------------------------------------------------------------------------------------------------

def _load(model, device, dtype, threads=0):
    import torch

    from .models import load_model

    if threads:
        torch.set_num_threads(threads)
    return load_model(model, device=device, dtype=dtype)


def _numbers(text: str, name: str, kind, what: str) -> list:
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SiftError(f"{name} {text!r}: expected comma-separated {what}") from None
    if not vals:
        raise SiftError(f"{name}: no values")
    return vals


def _floats(text: str, name: str) -> list[float]:
    return _numbers(text, name, float, "numbers")


def _ints(text: str, name: str) -> list[int]:
    return _numbers(text, name, int, "integers")


def _lengths(text: str) -> list[int]:
    out_ = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        mult = 1024 if x.endswith("k") else 1
        try:
            out_.append(int(float(x.rstrip("k")) * mult))
        except ValueError:
            raise SiftError(f"--lengths {text!r}: expected e.g. 8k,16k,32k,64k") from None
    if not out_:
        raise SiftError("--lengths: no values")
    return out_


@contextlib.contextmanager
def _progress(description: str, enabled: bool):
    if not (enabled and sys.stderr.isatty()):
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _profile_cfg(lm, tile, alpha, beta, gamma):
    from .config import resolve_profile_config

    return resolve_profile_config(lm.device, {"tile": tile, "alpha": alpha, "beta": beta, "gamma": gamma}).profile


def _dataset(data: str, data_dir, n_docs: int, n_prompts: int, seed: int, docs_per_prompt: int, words: int):
    from .lab.eval.prompt_sets import essay_prompt_set, nq_prompt_set

    if data == "nq":
        return nq_prompt_set(data_dir, n_docs, n_prompts, seed)
    if data == "essays":
        return essay_prompt_set(data_dir, n_prompts, docs_per_prompt, words, seed)
    raise SiftError(f"--data {data}: expected nq or essays")


def _f(x, nd=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e-2 and x != 0 else f"{x:.{nd}f}"
    return str(x)


def _plot(fn, result, path) -> None:
    if path is not None:
        p = fn(result, path)
        err.print(f"wrote {p}")


def _report(result: dict, save: Path | None, plot: Path | None, plot_fn, as_json: bool, render) -> None:
    """What every evaluation command ends with: --save, --plot, then one JSON object (--json) or tables."""
    _write_json(save, result)
    _plot(plot_fn, result, plot)
    if as_json:
        print_json(result)
    else:
        render(result)


def _write_json(path: Path | None, obj) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def _meta(lm) -> dict:
    import platform
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or None
    except Exception:
        commit = None
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "model": lm.name if lm else None,
            "device": str(lm.device) if lm else None, "machine": platform.node(), "commit": commit}


# ---- eval recall -----------------------------------------------------------------------------------------------

@eval_app.command()
def recall(
    shards: Optional[Path] = typer.Option(None, "--shards", help="shard directory (with --prompts)"),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL: {\"doc_ids\": [...], \"question\": ...}"),
    data: Optional[str] = typer.Option(None, "--data", help="built-in prompt sets: nq or essays (profiled here)"),
    n_docs: int = typer.Option(20, "--n-docs", help="passages per NQ prompt"),
    n_prompts: int = typer.Option(6, "--n-prompts"),
    docs_per_prompt: int = typer.Option(3, "--docs-per-prompt", help="essays per prompt"),
    words: int = typer.Option(1600, "--words", help="essays: first N words"),
    seed: int = typer.Option(0, "--seed"),
    tile: int = typer.Option(64, "--tile"),
    alpha: float = typer.Option(1e-3, "--alpha"),
    beta: float = typer.Option(1e-2, "--beta"),
    gamma: float = typer.Option(0.10, "--gamma"),
    block_m: int = typer.Option(128, "--block-m"),
    block_n: int = typer.Option(64, "--block-n"),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    data_dir: Optional[Path] = DataOpt, work: Optional[Path] = WorkOpt, threads: int = ThreadsOpt,
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = typer.Option(None, "--save", help="also write the JSON here"),
    as_json: bool = JsonOpt,
):
    """Recall of the truly high attention cells of composed prompts by the stored LA tiles and CA pages."""
    from .lab.eval.prompt_sets import compose, ensure_shards, read_prompt_file
    from .lab.eval.recall import run_recall
    from .shards.reader import ShardSet

    if (shards is None) == (data is None):
        raise SiftError("give either --shards DIR --prompts FILE, or --data nq|essays")
    lm = _load(model, device, dtype, threads)
    if data is not None:
        pset = _dataset(data, data_dir, n_docs, n_prompts, seed, docs_per_prompt, words)
        with _progress("profiling", not as_json) as prog:
            sh = ensure_shards(pset, lm, _profile_cfg(lm, tile, alpha, beta, gamma), work, progress=prog)
        specs, source = pset.prompts, pset.describe()
    else:
        if prompts is None:
            raise SiftError("--shards needs --prompts FILE")
        sh, specs = ShardSet(shards), read_prompt_file(prompts)
        source = {"shards": str(shards), "prompts": str(prompts)}
        alpha, beta, tile = float(sh.meta["sift.alpha"]), float(sh.meta["sift.beta"]), sh.tile
    built = [compose(sh, lm, s) for s in specs]
    with _progress("recall", not as_json) as prog:
        res = run_recall(lm, built, alpha, beta, block_m, block_n, progress=prog)
    res["source"], res["run"] = source, _meta(lm)
    _report(res, save, plot, _lazy("plot_recall"), as_json, render_recall)


def render_recall(res: dict) -> None:
    o, p = res["overall"], res["paper"]
    th = res["thresholds"]
    out.print(f"[bold]recall[/] over {len(res['prompts'])} prompts (T={th['tile_size']}, α={th['alpha']}, "
              f"β={th['beta']}; blocks {res['block'][0]}×{res['block'][1]})")
    a = res["area"]
    out.print(f"  attention area: always dense {pct(a['dense'])}, LA {pct(a['la'])}, CA {pct(a['ca'])}")
    t = Table(show_edge=False)
    for col in ("", "recall", "block recall", "chosen density", "true density", "chosen tiles/pages",
                "true tiles/pages", "paper recall", "paper chosen / true sparsity"):
        t.add_column(col, justify="right")
    t.add_row("LA", pct(o["la_recall"]), pct(o["la_block_recall"]), pct(o["la_chosen_density"]),
              pct(o["la_true_density"]), pct(o["la_chosen_tile_density"]), pct(o["la_true_tile_density"]),
              pct(p["la_recall"]), f"{pct(p['la_chosen_sparsity'])} / {pct(p['la_true_sparsity'])}")
    t.add_row("CA", pct(o["ca_recall"]), pct(o["ca_block_recall"]), pct(o["ca_chosen_density"]),
              pct(o["ca_true_density"]), pct(o["ca_chosen_page_density"]), pct(o["ca_true_page_density"]),
              pct(p["ca_recall"]), f"{pct(p['ca_chosen_sparsity'])} / {pct(p['ca_true_sparsity'])}")
    out.print(t)
    out.print(f"  attention mass of document rows kept by the computed blocks: {pct(o['attention_mass_kept'])}")
    t = Table(title="per layer", show_edge=False)
    for col in ("layer", "LA recall", "CA recall", "LA tiles chosen (heads q1..q3)", "LA tiles true", "CA pages chosen"):
        t.add_column(col, justify="right")
    for r in res["per_layer"]:
        h = r["la_tile_density_heads"]
        t.add_row(str(r["layer"]), pct(r["la_recall"]), pct(r["ca_recall"]),
                  f"{pct(r['la_chosen_tile_density'])} ({pct(h['q1'])}..{pct(h['q3'])})",
                  pct(r["la_true_tile_density"]), pct(r["ca_chosen_page_density"]))
    out.print(t)


def _lazy(name):
    def call(result, path):
        from .lab import plots

        return getattr(plots, name)(result, path)

    return call


# ---- eval qa ---------------------------------------------------------------------------------------------------

@eval_app.command("build-qa")
def build_qa(
    out_file: Path = typer.Option(..., "--out", "-o", help="records file to write (.jsonl or .jsonl.gz)"),
    n_docs: int = typer.Option(10, "--n-docs", help="passages per question (gold + distractors)"),
    questions: int = typer.Option(100, "--questions"),
    gold_position: str = typer.Option("random", "--gold-position", help="0-based slot of the gold passage, or random"),
    seed: int = typer.Option(0, "--seed"),
    data_dir: Optional[Path] = DataOpt,
    as_json: bool = JsonOpt,
):
    """Write multi-document QA records from nq-open-oracle: gold passage + other questions' gold passages."""
    from .lab.eval.qa import build_nq_records, write_qa_records

    pos = _gold_position(gold_position)
    recs = build_nq_records(data_dir, n_docs, questions, pos, seed)
    p = write_qa_records(recs, out_file)
    result = {"out": str(p), "records": len(recs), "n_docs": n_docs, "gold_position": gold_position, "seed": seed}
    if as_json:
        print_json(result)
    else:
        out.print(f"wrote {len(recs)} records ({n_docs} passages each, gold at {gold_position}) to {p}")


def _gold_position(text: str) -> int | None:
    if text == "random":
        return None
    try:
        v = int(text)
    except ValueError:
        raise SiftError(f"--gold-position {text!r}: expected an integer or random") from None
    if v < 0:
        raise SiftError("--gold-position must be >= 0")
    return v


@eval_app.command()
def qa(
    records: Optional[Path] = typer.Argument(None, help="QA records (JSON/JSONL, {question, answers, ctxs}); "
                                                        "omit with --nq"),
    nq: bool = typer.Option(False, "--nq", help="build the records from nq-open-oracle (see build-qa)"),
    n_docs: str = typer.Option("10", "--n-docs", help="documents per prompt, comma-separated to sweep (records "
                                                      "files: the first N contexts, gold kept)"),
    questions: int = typer.Option(50, "--questions", help="questions (sampled from a records file)"),
    gold_position: str = typer.Option("random", "--gold-position"),
    seed: int = typer.Option(0, "--seed"),
    modes: str = typer.Option("full,sift,sink+window,kv-reuse,cacheblend", "--modes"),
    backend: str = BackendOpt,
    max_new_tokens: int = typer.Option(16, "--max-new-tokens"),
    ratio: float = typer.Option(0.15, "--recompute-ratio", help="CacheBlend: share of tokens recomputed"),
    blend_mask: str = typer.Option("causal", "--blend-mask", help="CacheBlend mask: causal (exact) or bottom-right "
                                                                  "(as its released code)"),
    tile: int = typer.Option(64, "--tile"),
    alpha: float = typer.Option(1e-3, "--alpha"),
    beta: float = typer.Option(1e-2, "--beta"),
    gamma: float = typer.Option(0.10, "--gamma"),
    block_m: int = typer.Option(128, "--block-m"),
    block_n: int = typer.Option(64, "--block-n"),
    results: Optional[Path] = typer.Option(None, "--results", help="JSONL of per-question results: appended as "
                                                                  "they finish; a re-run resumes from it"),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    data_dir: Optional[Path] = DataOpt, work: Optional[Path] = WorkOpt, threads: int = ThreadsOpt,
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = typer.Option(None, "--save"),
    as_json: bool = JsonOpt,
):
    """Answer multi-document questions with full recompute, SIFT, sink+window, KV reuse and CacheBlend."""
    from .lab.eval.prompt_sets import ensure_shards
    from .lab.eval.backend import eval_backend
    from .lab.eval.qa import build_nq_records, read_qa_records, records_prompt_set, run_qa, sample_records

    if (records is None) != nq:
        raise SiftError("give a records file, or --nq to build records from nq-open-oracle")
    if blend_mask not in ("causal", "bottom-right"):
        raise SiftError("--blend-mask must be causal or bottom-right")
    if not 0 < ratio <= 1:
        raise SiftError("--recompute-ratio must be in (0, 1]")
    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    sizes = _ints(n_docs, "--n-docs")
    lm = _load(model, device, dtype, threads)
    cfg = _profile_cfg(lm, tile, alpha, beta, gamma)
    be = eval_backend(backend, lm.device)
    done = _read_results(results)
    runs = []
    for n in sizes:
        if nq:
            recs = build_nq_records(data_dir, n, questions, _gold_position(gold_position), seed)
            name = f"nq-s{seed}-g{gold_position}-"
        else:
            recs = sample_records(read_qa_records(records), questions, seed)
            name = f"{records.stem}-"
        pset = records_prompt_set(recs, name, n)
        with _progress(f"profiling ({n} docs)", not as_json) as prog:
            sh = ensure_shards(pset, lm, cfg, work / f"n{n}" if work else None, progress=prog)
        with _progress(f"answering ({n} docs)", not as_json) as prog:
            res = run_qa(lm, sh, pset, mode_list, be, max_new_tokens, block_m, block_n, ratio, 1, blend_mask,
                         done=done, on_item=lambda r: _append_result(results, r), progress=prog)
        res["n_docs"] = n
        res["questions"] = len(pset.prompts)
        res["mean_tokens"] = sum(it["tokens"] for it in res["items"]) / max(1, len(res["items"]))
        runs.append(res)
    result = {"runs": runs, "modes": list(runs[0]["modes"]) if runs else [], "run": _meta(lm),
              "thresholds": cfg.thresholds(), "source": "nq-open-oracle" if nq else str(records)}
    _report(result, save, plot, _lazy("plot_qa"), as_json, lambda res: [render_qa(r) for r in res["runs"]])


def _read_results(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    done = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interrupted run
            done[r["key"]] = r
    return done


def _append_result(path: Path | None, r: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")


def render_qa(r: dict) -> None:
    out.print(f"[bold]{r['n_docs']} documents[/], {r['questions']} questions, {r['mean_tokens']:.0f} tokens on "
              f"average (backend {r['backend']}, CacheBlend ratio {r['cacheblend']['ratio']}, mask "
              f"{r['cacheblend']['mask']})")
    t = Table(show_edge=False)
    t.add_column("mode", no_wrap=True)
    for col in ("n", "accuracy", "same answer as full", "same first token", "KL mean", "TTFT ms", "density"):
        t.add_column(col, justify="right")
    for mode, s in r["summary"].items():
        t.add_row(mode, str(s["n"]), pct(s["accuracy"]), pct(s["agreement_with_full"]),
                  pct(s["first_token_agreement"]), _f(s["kl_mean"]), f"{s['ttft_ms_median']:.0f}",
                  pct(s.get("cell_density_mean")) if "cell_density_mean" in s else "-")
    out.print(t)
    if r["backend"] == "reference":
        out.print("  TTFT here is the reference implementation's (PyTorch, no kernel): fidelity, not speed — "
                  "`sift bench prefill` measures speed on a GPU")


# ---- eval sweep ------------------------------------------------------------------------------------------------

def _points(points, tiles, alphas, betas, gammas):
    from .lab.eval.sweep import grid, parse_points

    if points:
        return parse_points(points)
    return grid(_ints(tiles, "--tiles"), _floats(alphas, "--alphas"), _floats(betas, "--betas"),
                _floats(gammas, "--gammas"))


@eval_app.command()
def sweep(
    data: Optional[str] = typer.Option(None, "--data", help="nq or essays"),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="or: sample prompts from this corpus"),
    n_docs: int = typer.Option(20, "--n-docs", help="passages per NQ prompt"),
    n_prompts: int = typer.Option(3, "--n-prompts"),
    docs_per_prompt: int = typer.Option(3, "--docs-per-prompt", help="essays / corpus documents per prompt"),
    words: int = typer.Option(1600, "--words"),
    seed: int = typer.Option(0, "--seed"),
    points: Optional[str] = typer.Option(None, "--points", help="explicit grid 'T,α,β,γ;T,α,β,γ;…'"),
    tiles: str = typer.Option("32,64", "--tiles"),
    alphas: str = typer.Option("0.001,0.01", "--alphas"),
    betas: str = typer.Option("0.01", "--betas"),
    gammas: str = typer.Option("0.1", "--gammas"),
    block_m: int = typer.Option(64, "--block-m", help="64×64 masks as in STUDY.md by default"),
    block_n: int = typer.Option(64, "--block-n"),
    with_recall: bool = typer.Option(False, "--recall", help="also measure recall at every point"),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens"),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    data_dir: Optional[Path] = DataOpt, threads: int = ThreadsOpt,
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = typer.Option(None, "--save"),
    as_json: bool = JsonOpt,
):
    """Density, KL, first-token and answer agreement over a grid of (T, α, β, γ)."""
    from .corpus import CorpusFormat
    from .lab.eval.prompt_sets import corpus_prompt_set
    from .lab.eval.backend import eval_backend
    from .lab.eval.sweep import run_sweep

    if (data is None) == (corpus is None):
        raise SiftError("give --data nq|essays or --corpus PATH")
    pts = _points(points, tiles, alphas, betas, gammas)
    lm = _load(model, device, dtype, threads)
    pset = _dataset(data, data_dir, n_docs, n_prompts, seed, docs_per_prompt, words) if data else \
        corpus_prompt_set(corpus, CorpusFormat(), n_prompts, docs_per_prompt, None, seed)
    with _progress("sweep", not as_json) as prog:
        res = run_sweep(lm, pset, pts, eval_backend(backend, lm.device), block_m, block_n, max_new_tokens,
                        with_recall, progress=prog)
    res["run"] = _meta(lm)
    _report(res, save, plot, _lazy("plot_sweep"), as_json, render_sweep)


def render_sweep(res: dict) -> None:
    ps = res["prompt_set"]
    out.print(f"[bold]sweep[/] on {ps['name']} ({ps['prompts']} prompts, {ps['documents']} documents; "
              f"{res['dense'][0]['tokens'] if res['dense'] else '-'} tokens in the first), blocks "
              f"{res['block'][0]}×{res['block'][1]}, backend {res['backend']}")
    t = Table(show_edge=False)
    cols = ["T", "α", "β", "γ", "density", "block density", "LA bits", "CA bits", "KL mean", "KL max",
            "same first token", f"same {res['max_new_tokens']}-token answer"]
    has_recall = any("la_recall" in p for p in res["points"])
    if has_recall:
        cols += ["LA recall", "CA recall"]
    for c in cols:
        t.add_column(c, justify="right")
    for p in res["points"]:
        row = [str(p["tile_size"]), f"{p['alpha']:g}", f"{p['beta']:g}", f"{p['gamma']:g}", f"{p['density']:.3f}",
               f"{p['block_density']:.3f}", pct(p["la_bit_density"]), pct(p["ca_bit_density"]), _f(p["kl_mean"], 2),
               _f(p["kl_max"], 2), f"{p['first_token_same_count']}/{p['n']}", f"{p['same_answer_count']}/{p['n']}"]
        if has_recall:
            row += [pct(p.get("la_recall")), pct(p.get("ca_recall"))]
        t.add_row(*row)
    out.print(t)


# ---- eval storage ----------------------------------------------------------------------------------------------

@eval_app.command()
def storage(
    shards: Optional[Path] = typer.Option(None, "--shards", help="also measure this shard directory"),
    tile: int = typer.Option(64, "--tile", help="tile size for the published-config rows"),
    models: Optional[str] = typer.Option(None, "--models", help="comma-separated subset of the built-in configs"),
    doc_lengths: str = typer.Option("128,512,1024,2048,4096,8192", "--doc-lengths"),
    plot: Optional[Path] = PlotOpt,
    as_json: bool = JsonOpt,
):
    """SIFT metadata bytes against KV-cache bytes: a shard directory and published model configs."""
    from .lab.eval.storage import MODELS, storage_report

    chosen = None
    if models:
        chosen = [m.strip() for m in models.split(",") if m.strip()]
        unknown = [m for m in chosen if m not in MODELS]
        if unknown:
            raise SiftError(f"--models: unknown {unknown[0]!r}; known: {', '.join(MODELS)}")
    if tile not in (16, 32, 64, 128, 256):
        raise SiftError("--tile must be a power of two from 16 to 256")
    res = storage_report(shards, tile, _ints(doc_lengths, "--doc-lengths"), chosen)
    _plot(_lazy("plot_storage"), res, plot)
    if as_json:
        print_json(res)
        return
    if "shards" in res:
        s = res["shards"]
        out.print(f"[bold]{s['path']}[/]: {s['documents']} documents, {s['tokens']:,} tokens (mean "
                  f"{s['tokens_mean']:.0f}), T={s['tile_size']}, model {s['model']}")
        out.print(f"  bit vectors {human_bytes(s['metadata_bytes'])} ({human_bytes(s['shard_bytes_on_disk'])} on disk "
                  f"with tokens) vs KV cache {human_bytes(s['kv_cache_bytes_bf16'])} (bf16): "
                  f"{s['kv_to_metadata_ratio'] or 0:,.0f}× smaller ({s['kv_to_disk_ratio'] or 0:,.0f}× on disk)")
    t = Table(title=f"per document, T={tile} (byte-padded as stored; the paper's unpadded bits in brackets)",
              show_edge=False)
    t.add_column("model", no_wrap=True)
    for c in ("L×H (KV)", "doc tokens", "SIFT", "KV cache", "KV / SIFT", "equal at"):
        t.add_column(c, justify="right")
    for r in res["models"]:
        t.add_row(r["model"], f"{r['layers']}×{r['heads']} ({r['kv_heads']})", f"{r['doc_tokens']:,}",
                  human_bytes(r["sift_bytes"]), human_bytes(r["kv_bytes"]),
                  f"{r['kv_over_sift']:,.0f}× ({r['kv_over_sift_unpadded']:,.0f}×)",
                  f"{r['crossover_doc_tokens'] / 1e6:.1f}M tok")
    out.print(t)
    t = Table(title="per prompt of 1K-token documents at T=32 (the paper's Fig. 15 setting)", show_edge=False)
    t.add_column("model", no_wrap=True)
    for c in ("prompt tokens", "SIFT", "KV cache", "KV per layer", "KV / SIFT"):
        t.add_column(c, justify="right")
    for r in res["prompts"]:
        t.add_row(r["model"], f"{r['prompt_tokens']:,}", human_bytes(r["sift_bytes"]), human_bytes(r["kv_bytes"]),
                  human_bytes(r["kv_bytes_per_layer"]), f"{r['kv_over_sift']:,.0f}×")
    out.print(t)
    out.print("paper: Llama-3-8B ~24,000× at typical document lengths, equal at 33.6M tokens; 1.0 / 2.5 / 4.5 MB "
              "per prompt at 15K / 32K / 64K")


# ---- calibrate -------------------------------------------------------------------------------------------------

def calibrate(
    corpus: str = typer.Argument(..., help="the corpus you will profile (same formats as `sift profile`)"),
    max_kl: Optional[float] = typer.Option(None, "--max-kl", help="target: mean KL(full ‖ SIFT) at the last "
                                                                  "position <= this"),
    min_agreement: Optional[float] = typer.Option(None, "--min-agreement", help="target: first-token agreement "
                                                                                ">= this (0..1)"),
    min_recall: Optional[float] = typer.Option(None, "--min-recall", help="target: min(LA, CA) recall >= this"),
    n_prompts: int = typer.Option(4, "--n-prompts", help="prompts sampled from the corpus"),
    docs_per_prompt: int = typer.Option(5, "--docs-per-prompt"),
    queries: Optional[Path] = typer.Option(None, "--queries", help="file of typical user questions, one per line"),
    seed: int = typer.Option(0, "--seed"),
    points: Optional[str] = typer.Option(None, "--points", help="explicit candidates 'T,α,β,γ;…'"),
    tiles: str = typer.Option("32,64", "--tiles"),
    alphas: str = typer.Option("0.001,0.003,0.01,0.03", "--alphas"),
    betas: str = typer.Option("0.01,0.03", "--betas"),
    gammas: str = typer.Option("0.1,0.3", "--gammas"),
    block_m: int = typer.Option(128, "--block-m"),
    block_n: int = typer.Option(64, "--block-n"),
    max_new_tokens: int = typer.Option(8, "--max-new-tokens", help="greedy tokens compared per prompt (reported)"),
    config_out: Path = typer.Option(Path("sift.toml"), "--config-out", help="where to write the choice (`sift "
                                                                            "profile` reads ./sift.toml)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="measure and report, write nothing"),
    id_field: str = typer.Option("id", "--id-field"),
    text_field: str = typer.Option("text", "--text-field"),
    title_field: str = typer.Option("title", "--title-field"),
    template: Optional[str] = typer.Option(None, "--template"),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt, threads: int = ThreadsOpt,
    as_json: bool = JsonOpt,
):
    """Pick the sparsest (T, α, β, γ) that meets your fidelity target on prompts from your corpus; write sift.toml."""
    from .corpus import corpus_format
    from .lab.eval.calibrate import Target, calibrate as run_calibrate
    from .lab.eval.prompt_sets import corpus_prompt_set
    from .config_file import write_config
    from .lab.eval.backend import eval_backend

    target = Target(max_kl, min_agreement, min_recall)
    target.check()
    pts = _points(points, tiles, alphas, betas, gammas)
    qs = None
    if queries is not None:
        if not queries.is_file():
            raise SiftError(f"--queries {queries}: file not found")
        qs = [ln.strip() for ln in queries.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if not qs:
            raise SiftError(f"--queries {queries}: no questions")
    fmt = corpus_format(id_field, text_field, title_field, template)
    lm = _load(model, device, dtype, threads)
    pset = corpus_prompt_set(corpus, fmt, n_prompts, docs_per_prompt, qs, seed)
    with _progress("calibrating", not as_json) as prog:
        res = run_calibrate(lm, pset, pts, target, eval_backend(backend, lm.device), block_m, block_n,
                            max_new_tokens, progress=prog)
    res["run"] = _meta(lm)
    chosen = res["chosen"]
    if chosen is not None and not dry_run:
        prof = {"tile": chosen["tile_size"], "alpha": chosen["alpha"], "beta": chosen["beta"],
                "gamma": chosen["gamma"]}
        cal = {"model": lm.name, "weights": lm.fingerprint, "config_hash": lm.config_hash, "corpus": str(corpus),
               "target": res["target"], "prompts": len(pset.prompts), "docs_per_prompt": docs_per_prompt,
               "density": round(chosen["density"], 4), "kl_mean": chosen["kl_mean"],
               "first_token_agreement": chosen["first_token_agreement"], "recall": chosen.get("recall"),
               "block": f"{block_m}x{block_n}", "date": res["run"]["date"]}
        res["config"] = str(write_config(config_out, prof, cal, "written by `sift calibrate`; read by `sift profile` "
                                                                 "as its default thresholds (flags still win)"))
    if as_json:
        print_json(res)
    else:
        render_calibrate(res)
    if chosen is None:
        raise typer.Exit(1)


def render_calibrate(res: dict) -> None:
    out.print(f"[bold]calibrate[/]: target {res['target']}; {res['prompt_set']['prompts']} prompts of "
              f"{res['prompt_set']['docs_per_prompt']} documents ({res['dense_tokens']} tokens); "
              f"{len(res['candidates'])} candidates, {len(res['evaluated'])} evaluated (sparsest first)")
    t = Table(show_edge=False)
    for c in ("T", "α", "β", "γ", "density", "KL mean", "first token", "recall", "meets target"):
        t.add_column(c, justify="right")
    for p in res["evaluated"]:
        t.add_row(str(p["tile_size"]), f"{p['alpha']:g}", f"{p['beta']:g}", f"{p['gamma']:g}", f"{p['density']:.3f}",
                  _f(p["kl_mean"], 2), pct(p["first_token_agreement"]), pct(p.get("recall")),
                  "[green]yes[/]" if p["meets_target"] else "no")
    out.print(t)
    c = res["chosen"]
    if c is None:
        err.print("[red]no candidate meets the target[/]: loosen it or add denser candidates (smaller α/β/γ); "
                  "nothing written")
        return
    out.print(f"chosen: T={c['tile_size']} α={c['alpha']:g} β={c['beta']:g} γ={c['gamma']:g} — computes "
              f"{pct(c['density'])} of causal attention cells")
    if res.get("config"):
        out.print(f"wrote {res['config']}: `sift profile` uses these thresholds by default")


# ---- bench prefill ---------------------------------------------------------------------------------------------

def bench_prefill(
    models: str = typer.Option("llama3-8b,smollm2", "--models", help="llama3-8b (8B-shaped, random weights) and/or "
                                                                     "smollm2 (real profiles)"),
    lengths: str = typer.Option("8k,16k,32k,64k", "--lengths"),
    pattern: str = typer.Option("paper", "--pattern", help="8B-shaped model's bits: paper (drawn at LA 27.3% / CA "
                                                           "5.8%) or sampled (from SmolLM2 profiles)"),
    doc_tokens: int = typer.Option(2048, "--doc-tokens", help="document length in the prompts"),
    modes: str = typer.Option("full,sift,cacheblend", "--modes"),
    backends: str = typer.Option("auto", "--backends", help="SIFT backends, comma-separated: auto, cuda, flex"),
    repeat: int = typer.Option(3, "--repeat"),
    warmup: int = typer.Option(1, "--warmup"),
    energy: bool = typer.Option(True, "--energy/--no-energy", help="NVML energy per mode"),
    ratio: float = typer.Option(0.15, "--recompute-ratio"),
    ssd_gbps: float = typer.Option(3.8, "--ssd-gbps", help="modelled SSD read bandwidth for CacheBlend"),
    model: Optional[str] = typer.Option(None, "--model", help="the SmolLM2 checkpoint (default: bundled)"),
    data_dir: Optional[Path] = DataOpt,
    cpu_smoke: bool = typer.Option(False, "--cpu-smoke", help="without a GPU: a tiny functional pass (timings "
                                                              "meaningless)"),
    save: Optional[Path] = typer.Option(None, "--save"),
    plot: Optional[Path] = PlotOpt,
    as_json: bool = JsonOpt,
):
    """TTFT of full recompute (cuDNN), SIFT and CacheBlend at 8K–64K, split, with energy (needs a GPU)."""
    from .lab.bench.prefill import require_gpu, run_bench, summarize_rows

    require_gpu(cpu_smoke)
    lens = _lengths(lengths)
    if cpu_smoke:
        lens = [min(x, 512) for x in lens][:2]
    log = (lambda *a: None) if as_json else (lambda msg: err.print(escape(str(msg))))
    rows = run_bench([m.strip() for m in models.split(",") if m.strip()], lens, pattern, doc_tokens if not cpu_smoke
                     else 128, tuple(m.strip() for m in modes.split(",")),
                     tuple(b.strip() for b in backends.split(",")), repeat, warmup, energy, ratio, ssd_gbps,
                     data_dir, model, cpu_smoke, log=log)
    result = {"rows": rows, "summary": summarize_rows(rows), "cpu_smoke": cpu_smoke}
    _report(result, save, plot, lambda res, p: _lazy("plot_bench")(res["rows"], p), as_json,
            lambda _: render_bench(rows, cpu_smoke))


def render_bench(rows: list[dict], cpu_smoke: bool = False) -> None:
    if cpu_smoke:
        out.print("[yellow]CPU smoke run: the code paths work; the timings mean nothing[/]")
    t = Table(show_edge=False)
    for c in ("model", "bits", "tokens", "mode", "TTFT ms", "attention", "proj+MLP", "decode", "transfer",
              "density", "×full", "TTFT/ideal", "J", "tok/J", "EDP", "ED²P"):
        t.add_column(c, justify="right")
    for r in rows:
        if "error" in r:
            t.add_row(escape(r.get("model", "")[:24]), escape(r.get("pattern", "")[:28]), str(r.get("tokens")),
                      r.get("mode", ""), f"[red]{escape(r['error'][:60])}[/]")
            continue
        t.add_row(escape(r["model"][:24]), escape(r["pattern"][:28]), f"{r['tokens']:,}", r["mode"],
                  f"{r['ttft_ms']:.1f}", _f(r.get("attention_ms"), 1), _f(r.get("other_ms"), 1),
                  _f(r.get("decode_ms"), 2), _f(r.get("transfer_ms"), 2), _f(r.get("cell_density"), 3),
                  _f(r.get("speedup"), 2), _f(r.get("ttft_over_ideal"), 3), _f(r.get("energy_j"), 2),
                  _f(r.get("tokens_per_j"), 0), _f(r.get("edp"), 3), _f(r.get("ed2p"), 3))
    out.print(t)
