"""The `sift` command line: parse, call the library, render with rich or JSON. No logic lives here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .console import err, human_bytes, out, pct, print_json, token_progress
from .errors import SiftError

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False,
                  help="Profile a RAG corpus offline into attention bit vectors; run sparse prefill online.")

ModelOpt = typer.Option(None, "--model", help="HF model id (offline cache), local directory or .gguf file; "
                                              "default: the bundled SmolLM2-135M-Instruct GGUF")
DeviceOpt = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto")
DtypeOpt = typer.Option("auto", "--dtype", help="model dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16")
JsonOpt = typer.Option(False, "--json", help="print one JSON object on stdout")
TrustOpt = typer.Option(False, "--trust-remote-code", help="allow model code from the checkpoint (off by default)")
OnlineOpt = typer.Option(False, "--online", help="allow downloading the model from the Hugging Face Hub")


def _load(model, device, dtype, trust_remote_code=False, online=False):
    from .models import load_model

    return load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, online=online)


# ---- profile ---------------------------------------------------------------------------------------------------

@app.command()
def profile(
    ctx: typer.Context,
    corpus: str = typer.Argument(..., help="directory of .txt/.md, .jsonl[.gz|.zst], .parquet, "
                                           "or builtin:stdlib-docs"),
    out_dir: Path = typer.Option(..., "--out", "-o", help="shard directory (created; resumable)"),
    model: Optional[str] = ModelOpt,
    tile: Optional[int] = typer.Option(None, "--tile", help="tile/page size T (power of two, 16..256; default 64 "
                                                            "or sift.toml's)"),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="LA threshold: a tile is kept if any probability "
                                                                ">= alpha (default 0.001 or sift.toml's)"),
    beta: Optional[float] = typer.Option(None, "--beta", help="CA score threshold (default 0.01 or sift.toml's)"),
    gamma: Optional[float] = typer.Option(None, "--gamma", help="CA concentration threshold (default 0.10 or "
                                                                "sift.toml's)"),
    config: Optional[Path] = typer.Option(None, "--config", help="thresholds file written by `sift calibrate` "
                                                                  "(default: $SIFT_CONFIG, else ./sift.toml)"),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    batch_tokens: int = typer.Option(0, "--batch-tokens", help="padded tokens per forward batch "
                                                               "(0: 16384 on CPU, 65536 on GPU)"),
    num_shards: Optional[int] = typer.Option(None, "--num-shards", help="number of shard files (hash buckets); "
                                                                         "default: one per --docs-per-shard docs"),
    docs_per_shard: int = typer.Option(1000, "--docs-per-shard"),
    strict: bool = typer.Option(False, "--strict", help="fail on documents longer than the model's context "
                                                        "instead of skipping them"),
    id_field: str = typer.Option("id", "--id-field", help="JSONL/Parquet id field"),
    text_field: str = typer.Option("text", "--text-field", help="JSONL/Parquet text field"),
    title_field: str = typer.Option("title", "--title-field", help="JSONL/Parquet title field (optional)"),
    template: Optional[str] = typer.Option(None, "--template", help="document template with {title}, {text}, "
                                                                     "{id}; default 'Title: {title}\\n{text}\\n\\n'"),
    prefix_text: Optional[str] = typer.Option(None, "--prefix-text", help="prompt prefix text (default: the "
                                                                           "chat template up to the user turn)"),
    stats: str = typer.Option("auto", "--stats", help="attention statistics: auto (triton on CUDA), torch "
                                                      "(reference), triton"),
    rank: Optional[int] = typer.Option(None, "--rank", help="this worker's rank (default: from torchrun or Slurm "
                                                            "variables, else 0); it profiles shards s % world == rank"),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="number of workers (with --rank)"),
    gpus: int = typer.Option(0, "--gpus", help="launch N local workers, one per GPU, and wait for all"),
    trust_remote_code: bool = TrustOpt,
    online: bool = OnlineOpt,
    as_json: bool = JsonOpt,
):
    """Profile every document of CORPUS into Parquet bit-vector shards under --out."""
    from .corpus import corpus_format
    from .launch.local import CHILD_DROPS, command_argv, profile_with_local_workers
    from .launch.worker import ProfileWorker

    fmt = corpus_format(id_field, text_field, title_field, template)
    if gpus:
        total = profile_with_local_workers(command_argv(ctx, CHILD_DROPS), gpus, corpus, out_dir, fmt, num_shards,
                                           docs_per_shard, device, rank, world_size)
        return _render_local_workers(total, as_json)
    worker = ProfileWorker.start(corpus, out_dir, model=model, device=device, dtype=dtype,
                                 trust_remote_code=trust_remote_code, online=online,
                                 flags={"tile": tile, "alpha": alpha, "beta": beta, "gamma": gamma,
                                        "batch_tokens": batch_tokens, "stats": stats},
                                 read_config_file=True, config_file=config, fmt=fmt, num_shards=num_shards,
                                 docs_per_shard=docs_per_shard, strict=strict, prefix_text=prefix_text, rank=rank,
                                 world_size=world_size)
    if worker.config.warning and not as_json:
        err.print(f"[yellow]warning:[/] {escape(worker.config.warning)}")
    with token_progress("profiling", not as_json) as progress:
        report = worker.run(progress)
    lm, rank_ = worker.lm, worker.rank
    if as_json:
        print_json({**report.to_json(), "worker": rank_.to_json(), "device": str(lm.device)})
        return
    if rank_.world_size > 1:
        out.print(f"worker {rank_.rank} of {rank_.world_size} ({rank_.source}): {len(worker.only_shards)} of "
                  f"{report.num_shards} shards are this worker's")
    out.print(f"[bold]{report.out}[/]: {report.documents} documents in {report.num_shards} shards")
    out.print(f"  profiled {report.profiled} documents ({report.tokens} tokens) in {report.seconds:.1f} s "
              f"= {report.tokens_per_second:,.0f} tokens/s on {lm.device}")
    if report.reused:
        out.print(f"  reused {report.reused} documents from {report.shards_reused} finished shards")
    if report.skipped_too_long:
        out.print(f"  [yellow]skipped {len(report.skipped_too_long)} documents longer than the model's context "
                  f"({lm.max_context} tokens)[/]: {', '.join(report.skipped_too_long[:5])}"
                  + (" ..." if len(report.skipped_too_long) > 5 else ""))
    if report.manifest:
        out.print(f"  manifest: {report.manifest}")


def _render_local_workers(total: dict, as_json: bool) -> None:
    if as_json:
        print_json(total)
        return
    out.print(f"[bold]{total['out']}[/]: {total['documents']} documents in {total['num_shards']} shards, "
              f"{total['workers']} workers")
    out.print(f"  profiled {total['profiled']} documents ({total['tokens']} tokens) in {total['seconds']:.1f} s "
              f"= {total['tokens_per_second']:,.0f} tokens/s")
    if total["reused"]:
        out.print(f"  reused {total['reused']} documents from {total['shards_reused']} finished shards")
    if total["manifest"]:
        out.print(f"  manifest: {total['manifest']}")


# ---- inspect / validate / status -------------------------------------------------------------------------------

@app.command()
def inspect(
    path: Path = typer.Argument(..., help="a shard file or a shard directory"),
    doc: Optional[str] = typer.Option(None, "--doc", help="draw this document's tile map"),
    layer: int = typer.Option(0, "--layer"),
    head: int = typer.Option(0, "--head"),
    as_json: bool = JsonOpt,
):
    """Sparsity statistics of shards (overall and per layer) and metadata size against the KV cache."""
    from .shards.inspection import draw_tile_map, inspect_shards, tile_map

    if doc is not None:
        tm = tile_map(path, doc, layer, head)
        if as_json:
            print_json(tm)
        else:
            out.print(draw_tile_map(tm))
        return
    s = inspect_shards(path)
    if as_json:
        print_json(s)
        return
    out.print(f"[bold]{s['path']}[/]: {s['files']} files, {s['documents']} documents, {s['tokens']:,} tokens "
              f"(per document {s['tokens_min']}..{s['tokens_max']}, mean {s['tokens_mean']:.0f})")
    out.print(f"  model {s['model']['name']}  ({s['n_layers']} layers × {s['n_heads']} heads, "
              f"{s['n_kv_heads']} KV heads, head_dim {s['head_dim']})")
    out.print(f"  T={s['tile_size']}  α={s['alpha']}  β={s['beta']}  γ={s['gamma']}  "
              f"tiles {s['tiles']:,}  pages {s['pages']:,}")
    out.print(f"  LA density {pct(s['la_density'])}   CA density {pct(s['ca_density'])}")
    out.print(f"  metadata {human_bytes(s['metadata_bytes'])} ({human_bytes(s['shard_bytes_on_disk'])} on disk "
              f"with tokens) vs KV cache {human_bytes(s['kv_cache_bytes_bf16'])} (bf16): "
              f"{s['kv_to_metadata_ratio'] or 0:,.0f}× smaller")
    table = Table(title=escape("per layer (mean over heads, [min..max])"), show_edge=False)
    for col in ("layer", "LA density", "LA spread", "CA density", "CA spread"):
        table.add_column(col, justify="right")
    for r in s["per_layer"]:
        table.add_row(str(r["layer"]), pct(r["la_density"]), f"{pct(r['la_min'])}..{pct(r['la_max'])}",
                      pct(r["ca_density"]), f"{pct(r['ca_min'])}..{pct(r['ca_max'])}")
    out.print(table)


@app.command()
def validate(
    path: Path = typer.Argument(..., help="a shard file or a shard directory"),
    as_json: bool = JsonOpt,
):
    """Check shards: schema, bit-vector lengths, token hashes, duplicates, metadata, manifest. Exit 1 on problems."""
    from .shards.validate import validate_path

    result = validate_path(path)
    if as_json:
        print_json(result)
    elif result["ok"]:
        out.print(f"[green]ok[/]: {result['path']}: {result['files']} files, {result['documents']} documents")
    else:
        err.print(f"[red]{len(result['problems'])} problems[/] in {result['path']}:")
        for p in result["problems"]:
            err.print(f"  - {escape(p)}")
    if not result["ok"]:
        raise typer.Exit(1)


@app.command()
def status(
    path: Path = typer.Argument(..., help="a shard directory"),
    finalize: bool = typer.Option(False, "--finalize", help="write the manifest when every shard is done"),
    as_json: bool = JsonOpt,
):
    """Which shards of a directory are done, in progress (held by a live worker) and missing; --finalize writes
    the manifest (and removes leftover lock and temporary files)."""
    from .shards.status import shard_status

    result = shard_status(path, finalize)
    n, missing, running = result["num_shards"], result["missing"], result["running"]
    if as_json:
        print_json(result)
    else:
        out.print(f"{path}: {result['done']}/{n} shards done" + (f"; missing {missing[:10]}" if missing else "")
                  + (f" ({len(running)} in progress: {running[:10]})" if running else "")
                  + (f"; manifest {result['manifest']}" if result["manifest"] else "; no manifest yet"))
    if missing and not as_json:
        raise typer.Exit(3)


# ---- prefill ---------------------------------------------------------------------------------------------------

@app.command()
def prefill(
    shards_dir: Path = typer.Option(..., "--shards", help="shard directory made by `sift profile`"),
    docs: Path = typer.Option(..., "--docs", help="file with one doc_id per line, in prompt order"),
    query: Path = typer.Option(..., "--query", help="file holding the user's question"),
    model: Optional[str] = ModelOpt,
    backend: str = typer.Option("auto", "--backend", help="auto, reference, flex or cuda"),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    max_new_tokens: int = typer.Option(16, "--max-new-tokens"),
    repeat: int = typer.Option(3, "--repeat", help="timed runs of each mode (median reported)"),
    block_m: int = typer.Option(128, "--block-m", help="query block size"),
    block_n: int = typer.Option(64, "--block-n", help="KV block size (64 or 128)"),
    trust_remote_code: bool = TrustOpt,
    online: bool = OnlineOpt,
    as_json: bool = JsonOpt,
):
    """Assemble a RAG prompt from profiled documents; run full recompute and SIFT side by side."""
    from .prompt import read_doc_ids, read_query

    doc_ids, question = read_doc_ids(docs), read_query(query)
    _run_prefill(shards_dir, doc_ids, question, model, backend, device, dtype, max_new_tokens, repeat, block_m,
                 block_n, trust_remote_code, online, as_json)


def _run_prefill(shards_dir, doc_ids, question, model, backend, device, dtype, max_new_tokens, repeat, block_m,
                 block_n, trust_remote_code=False, online=False, as_json=False):
    from .prefill import run_prefill
    from .prompt import assemble
    from .shards.reader import ShardSet

    if block_n not in (64, 128) or block_m not in (64, 128, 192, 256):
        raise SiftError("--block-n must be 64 or 128 and --block-m one of 64, 128, 192, 256")
    shards = ShardSet(shards_dir)
    lm = _load(model, device, dtype, trust_remote_code, online)
    prompt = assemble(shards, lm, doc_ids, question)
    report = run_prefill(lm, prompt, backend, repeat=repeat, max_new_tokens=max_new_tokens, block_m=block_m,
                         block_n=block_n)
    if as_json:
        print_json(report)
    else:
        render_prefill(report, question)
    return report


def render_prefill(r: dict, question: str) -> None:
    pt = r["prompt_tokens"]
    out.print(f"[bold]prompt[/]: {pt['total']} tokens = prefix {pt['prefix']} + {len(pt['docs'])} documents "
              f"{pt['docs']} + suffix {pt['suffix']}   ({r['model']}, {r['device']}, {r['dtype']})")
    d = r["density"]
    out.print(f"[bold]attention computed[/]: {pct(d['blocks'])} of causal {r['block_m']}×{r['block_n']} blocks, "
              f"{pct(d['cells'])} of causal cells (T={r['tile_size']}, backend {r['backend']})")
    table = Table(show_edge=False)
    for col in ("", "TTFT ms", "answer"):
        table.add_column(col)
    table.add_row("full recompute", f"{r['dense']['ttft_ms']:.1f}", escape(r["dense"]["text"].strip()))
    table.add_row("SIFT", f"{r['sift']['ttft_ms']:.1f}", escape(r["sift"]["text"].strip()))
    out.print(f"[bold]question[/]: {escape(question)}")
    out.print(table)
    out.print(f"speed-up {r['speedup']:.2f}×   decode {r['decode_ms']:.2f} ms "
              f"({pct(r['decode_share_of_ttft'])} of SIFT TTFT)   first token "
              f"{'same' if r['first_token_match'] else 'DIFFERENT'}   KL {r['kl']:.2e}   "
              f"max |Δlogit| {r['max_abs_logit_diff']:.3f}")
    if r["backend"] == "reference":
        out.print("[dim]The reference backend checks correctness; it is not a speed path (it computes every score "
                  "and masks). Timings that matter need --backend cuda or flex on a GPU.[/]")


@app.command("demo-prefill", hidden=True)
def demo_prefill(
    shards_dir: Path = typer.Option(..., "--shards"),
    device: str = DeviceOpt,
):
    """Answer the built-in sample questions from shards of the built-in sample corpus."""
    from .sample import SAMPLE_QUESTIONS

    for doc_ids, question in SAMPLE_QUESTIONS[:2]:
        _run_prefill(shards_dir, list(doc_ids), question, None, "auto", device, "auto", 12, 1, 128, 64)
        out.print()


# ---- bench -----------------------------------------------------------------------------------------------------

bench_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmarks measured side by side in one run.")
app.add_typer(bench_app, name="bench")


@bench_app.command("kernels")
def bench_kernels(
    quick: bool = typer.Option(False, "--quick", help="fewer lengths and densities"),
    markdown: bool = typer.Option(False, "--markdown", help="print the table as Markdown (for docs/benchmarks.md)"),
    as_json: bool = JsonOpt,
):
    """Sparse attention kernel vs cuDNN SDPA (dense causal) vs FlexAttention, and the decode kernel (GPU)."""
    import torch

    if not torch.cuda.is_available():
        raise SiftError("sift bench kernels needs a CUDA GPU (Hopper for the bundled kernels)")
    from .lab.bench import attention_kernels as kb

    rows = kb.run_kernel_bench(quick=quick)
    if as_json:
        print_json(rows)
    elif markdown:
        out.print(kb.markdown(rows), markup=False)
    else:
        out.print(kb.render(rows))


@bench_app.command("profile")
def bench_profile(
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="folder with the NQ file and essays "
                                                                       "(default: $SIFT_DATA_DIR)"),
    device: str = typer.Option("cuda", "--device"),
    quick: bool = typer.Option(False, "--quick", help="fewer documents per case"),
    cases: str = typer.Option("nq,essays,8b-2k,8b-8k", "--cases", help="comma-separated subset"),
    as_json: bool = JsonOpt,
):
    """Dense prefill vs the whole `sift profile` run (each statistics path) on the same documents."""
    from .lab.bench import profile as bp

    rows = bp.run_profile_bench(data_dir=data_dir, device=device, quick=quick,
                                cases=tuple(c.strip() for c in cases.split(",") if c.strip()),
                                log=(lambda *a, **k: None) if as_json else (lambda m: err.print(escape(str(m)))))
    if as_json:
        print_json(rows)
    else:
        out.print(bp.render(rows))


@app.command("sample-corpus")
def sample_corpus(directory: Path = typer.Argument(..., help="where to write the .txt files")):
    """Write the built-in sample corpus (Python standard-library documentation) to a directory."""
    from .sample import write_sample_corpus

    p = write_sample_corpus(directory)
    out.print(f"wrote {len(list(p.glob('*.txt')))} documents to {p}")


# ---- eval, calibrate, bench prefill (sift_cli/cli_eval.py) ------------------------------------------------------

from .cli_eval import bench_prefill, calibrate, eval_app  # noqa: E402  (mounted after the app exists)

app.add_typer(eval_app, name="eval")
app.command("calibrate")(calibrate)
bench_app.command("prefill")(bench_prefill)


def main() -> None:
    debug = os.environ.get("SIFT_DEBUG", "") not in ("", "0")
    try:
        rc = app(standalone_mode=False)  # click returns (not raises) the code of typer.Exit here
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except SiftError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] {escape(str(exc))}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("[red]interrupted[/]")
        sys.exit(130)
    except Exception as exc:  # usage errors and the unexpected: one line, no traceback
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):  # typer's click exceptions
            exc.show()
            sys.exit(exc.exit_code)
        if debug:
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        err.print(f"[red]error:[/] {type(exc).__name__}: {escape(first)} (set SIFT_DEBUG=1 for the traceback)")
        sys.exit(1)


if __name__ == "__main__":
    main()
