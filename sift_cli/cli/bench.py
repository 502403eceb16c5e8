"""`sift bench kernels | profile | prefill | store | gather`: speed measured side by side in one run (the lab's
`bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import SiftError
from .console import err, fmt, out
from .options import DataOpt, JsonOpt, PlotOpt
from .results import SaveOpt, check_outputs, finish

bench_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmarks measured side by side in one run.")


@bench_app.command("kernels")
def bench_kernels(
    quick: bool = typer.Option(False, "--quick", help="fewer lengths and densities"),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="e.g. 16k,32k (default 16k,32k,64k; --quick 16k)"),
    timing: str = typer.Option("graph", "--timing", help="graph: GPU time of CUDA-graph replays, as the prefill "
                                                          "experiments run the kernels; eager: CUDA events around "
                                                          "launches; both: each row twice, labelled"),
    layouts: str = typer.Option("causal,documents", "--layouts", help="causal and/or documents"),
    flex: bool = typer.Option(True, "--flex/--no-flex", help="FlexAttention on the same document-aligned blocks"),
    decode: bool = typer.Option(True, "--decode/--no-decode", help="the bit-vector decode rows"),
    markdown: bool = typer.Option(False, "--markdown", help="print the table as Markdown"),
    save: Optional[Path] = SaveOpt,
    as_json: bool = JsonOpt,
):
    """Sparse attention kernel vs cuDNN SDPA (dense causal) vs FlexAttention (its block mask built from the same
    document-aligned block table, compiled once per layout), and the decode kernel (GPU). Each row says how it was
    timed (`timing`)."""
    from ..lab.bench import attention_kernels as kb

    if timing not in ("graph", "eager", "both"):
        raise SiftError(f"--timing {timing!r}: expected graph, eager or both")
    chosen = {x.strip() for x in layouts.split(",") if x.strip()}
    if not chosen or chosen - {"causal", "documents"}:
        raise SiftError(f"--layouts {layouts!r}: expected causal and/or documents")
    rows = kb.run_kernel_bench(quick=quick, lengths=tuple(_lengths(lengths)) if lengths else None,
                               timings=("graph", "eager") if timing == "both" else (timing,),
                               causal="causal" in chosen, documents="documents" in chosen, flex=flex, decode=decode,
                               log=(lambda *a, **k: None) if as_json else (lambda m: err.print(escape(str(m)))))
    result = {"rows": rows, "protocol": kb.protocol(timing)}

    def show(res):
        if markdown:
            out.print(kb.markdown(res["rows"]), markup=False)
        else:
            out.print(kb.render(res["rows"]))

    finish(result, save, None, None, as_json, show, kind="bench-kernels")


@bench_app.command("profile")
def bench_profile(
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="folder with the NQ file and essays "
                                                                       "(default: $SIFT_DATA_DIR)"),
    device: str = typer.Option("cuda", "--device"),
    quick: bool = typer.Option(False, "--quick", help="fewer documents per case"),
    cases: str = typer.Option("nq,essays,8b-2k,8b-8k", "--cases", help="comma-separated subset"),
    save: Optional[Path] = SaveOpt,
    as_json: bool = JsonOpt,
):
    """Dense prefill vs the whole `sift profile` run (each statistics path) on the same documents."""
    from ..lab.bench import profile as bp

    rows = bp.run_profile_bench(data_dir=data_dir, device=device, quick=quick,
                                cases=tuple(c.strip() for c in cases.split(",") if c.strip()),
                                log=(lambda *a, **k: None) if as_json else (lambda m: err.print(escape(str(m)))))
    finish({"rows": rows}, save, None, None, as_json, lambda res: out.print(bp.render(res["rows"])),
           kind="bench-profile")
    failed = bp.failures(rows)
    for line in failed:
        err.print(f"[red]failed[/]: {escape(line)}")
    if failed:
        raise typer.Exit(1)


@bench_app.command("prefill")
def bench_prefill(
    models: str = typer.Option("llama3-8b,smollm2", "--models", help="llama3-8b (8B-shaped, random weights) and/or "
                                                                     "smollm2 (real profiles)"),
    lengths: str = typer.Option("8k,16k,32k,64k", "--lengths"),
    pattern: str = typer.Option("paper", "--pattern", help="8B-shaped model's bits: paper (drawn at LA 27.3% / CA "
                                                           "5.8%) or sampled (from SmolLM2 profiles)"),
    doc_tokens: str = typer.Option("300-3000", "--doc-tokens", help="document length in the prompts: N, or LO-HI "
                                                                    "to draw each document's length"),
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
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="the graphed protocol: full recompute, "
                                                                  "no-attention and SIFT (decode included) each "
                                                                  "captured as a CUDA graph, replays timed; "
                                                                  "CacheBlend (not capturable) left out"),
    query_blocks: str = typer.Option("auto", "--query-blocks", help="segment, grid (block_table.py) or auto (the "
                                                                   "backend's choice for the bits)"),
    block_m: str = typer.Option("auto", "--block-m", help="SIFT's query block rows: auto (the backend's), 128 "
                                                           "and/or 64 (comma-separated: one SIFT row per size)"),
    unprofiled: int = typer.Option(0, "--unprofiled", help="documents per 8B-shaped prompt left without bits "
                                                           "(computed densely), evenly spread"),
    corpus_docs: int = typer.Option(0, "--corpus-docs", help="draw the 8B-shaped prompts' documents from a shard "
                                                              "set of this many documents, SIFT's bits looked up in "
                                                              "its serving store inside each timed prefill"),
    corpus_dir: Optional[Path] = typer.Option(None, "--corpus-dir", help="where that set is built, or reused from "
                                                                         "(default: a temporary folder, removed)"),
    save: Optional[Path] = SaveOpt,
    plot: Optional[Path] = PlotOpt,
    as_json: bool = JsonOpt,
):
    """TTFT of full recompute (cuDNN), SIFT and CacheBlend at 8K–64K, split, with energy (needs a GPU). One protocol
    per run: eager, or graphed with --cuda-graphs; every mode of a row (full, no-attention, SIFT; time and energy) is
    measured the same way, full and no-attention interleaved, all warm. SIFT's rows give two ideals: at the cells
    the bits select (TTFT/ideal) and at the cells computed (TTFT/ideal c.), with cells/allowed beside them."""
    from ..lab.bench.prefill import bench_prefill as run

    log = (lambda *a: None) if as_json else (lambda msg: err.print(escape(str(msg))))
    check_outputs(save, plot)
    result = run([m.strip() for m in models.split(",") if m.strip()], _lengths(lengths), pattern,
                 _doc_tokens(doc_tokens), tuple(m.strip() for m in modes.split(",")),
                 tuple(b.strip() for b in backends.split(",")), repeat, warmup, energy, ratio, ssd_gbps, data_dir,
                 model, cpu_smoke, log=log, cuda_graphs=cuda_graphs, query_blocks=query_blocks,
                 unprofiled=unprofiled, block_ms=_block_ms(block_m), corpus_docs=corpus_docs, corpus_dir=corpus_dir)
    finish(result, save, plot, "plot_bench", as_json, lambda res: render_bench(res["rows"], res["cpu_smoke"]),
           plot_of=lambda res: res["rows"], kind="bench-prefill")


@bench_app.command("store")
def bench_store(
    sizes: str = typer.Option("10000,100000,1000000", "--sizes", help="documents per set, comma-separated"),
    shape: str = typer.Option("smollm2", "--shape", help="the bits' model shape: smollm2 or llama8b"),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="where the sets are built and kept for the next "
                                                                     "run (default: a temporary folder, removed)"),
    docs_per_shard: int = typer.Option(1000, "--docs-per-shard"),
    doc_tokens: str = typer.Option("100-1500", "--doc-tokens", help="LO-HI: each document's length is drawn"),
    ids: int = typer.Option(20, "--ids", help="random ids per request"),
    requests: int = typer.Option(200, "--requests", help="warm requests timed (after as many untimed)"),
    cold: int = typer.Option(10, "--cold", help="requests timed each after dropping the set from the page cache"),
    workers: int = typer.Option(2, "--workers", help="processes writing a set"),
    scans: bool = typer.Option(True, "--scans/--no-scans", help="also time validate, inspect, ids --json and "
                                                                 "status --finalize"),
    save: Optional[Path] = SaveOpt,
    as_json: bool = JsonOpt,
):
    """Fetching a prompt's bits from sets of 10^4-10^6 documents: the serving store beside the Parquet reader (open,
    a new process's first request, warm and cold p50/p99, bytes read, memory), and the full scans at that scale.
    Each measurement runs in a process of its own."""
    from ..lab.bench.store import render, run_store_bench

    log = (lambda *a: None) if as_json else (lambda msg: err.print(escape(str(msg))))
    try:
        lo, hi = (int(x) for x in doc_tokens.split("-"))
        counts = tuple(int(x) for x in sizes.split(",") if x.strip())
    except ValueError:
        raise SiftError(f"--sizes {sizes!r} / --doc-tokens {doc_tokens!r}: expected numbers like 10000,100000 and "
                        f"100-1500") from None
    check_outputs(save)
    result = run_store_bench(counts, shape, work_dir, docs_per_shard, (lo, hi), ids, requests, cold, workers=workers,
                             scans=scans, log=log)

    def show(res):
        for table in render(res):
            out.print(table)

    finish(result, save, None, None, as_json, show, kind="bench-store")


@bench_app.command("gather")
def bench_gather(
    shards: Path = typer.Option(..., "--shards", help="a shard set of long documents (a prompt takes its first "
                                                      "ids whose tokens come closest to each length)"),
    lengths: str = typer.Option("2048,4096,6144,8192", "--lengths", help="prompt tokens, comma-separated"),
    repeat: int = typer.Option(3, "--repeat", help="timed runs of each mode, interleaved"),
    warmup: int = typer.Option(1, "--warmup", help="untimed runs of each mode first"),
    model: Optional[str] = typer.Option(None, "--model", help="the set's model (default: the bundled one)"),
    save: Optional[Path] = typer.Option(None, "--save"),
    as_json: bool = JsonOpt,
):
    """The CPU's sparse path (gather backend) against full recompute at RAG lengths, on real profiles: median of
    interleaved warm runs, with the cells SIFT computed."""
    from ..lab.bench.gather import run_gather_bench

    try:
        targets = tuple(int(x) for x in lengths.split(",") if x.strip())
    except ValueError:
        raise SiftError(f"--lengths {lengths!r}: expected token counts like 2048,4096") from None
    if not targets or min(targets) < 1 or repeat < 1 or warmup < 0:
        raise SiftError("--lengths needs positive token counts, --repeat at least 1 and --warmup at least 0")
    log = (lambda *a: None) if as_json else (lambda msg: err.print(escape(str(msg))))
    result = run_gather_bench(shards, targets, repeat, warmup, model, log=log)

    def show(res):
        t = Table(show_edge=False)
        for c in ("tokens", "docs", "cells", "full recompute ms", "SIFT ms", "×full", "first token"):
            t.add_column(c, justify="right")
        for r in res["rows"]:
            if "error" in r:
                t.add_row(f"{r['target_tokens']:,}", str(r.get("docs", "–")), f"[red]{escape(r['error'][:80])}[/]")
                continue
            t.add_row(f"{r['tokens']:,}", str(r["docs"]), f"{r['cells']:.1%}", f"{r['full_ms']:,.0f}",
                      f"{r['sift_ms']:,.0f}", fmt(r["speedup"], 2), "same" if r["first_token_match"] else "DIFFERENT")
        out.print(t)
        timing = res["timing"]
        out.print(f"[dim]{res['model']}, CPU, {res['threads']} threads; median of {timing['repeat']} interleaved runs "
                  f"after {timing['warmup']} warm-up(s)[/]")
        if timing["speedup_withheld"]:
            out.print(f"[dim]{escape(timing['speedup_withheld'])}[/]")

    finish(result, save, None, None, as_json, show, kind="bench-gather")


def render_bench(rows: list[dict], cpu_smoke: bool = False) -> None:
    if cpu_smoke:
        out.print("[yellow]CPU smoke run: the code paths work; the timings mean nothing[/]")
    t = Table(show_edge=False)
    for c in ("model", "bits", "tokens", "mode", "protocol", "TTFT ms", "attention", "proj+MLP", "lookup", "decode",
              "transfer", "density", "cells/allowed", "×full", "TTFT/ideal", "TTFT/ideal c.", "J", "tok/J", "EDP",
              "ED²P"):
        t.add_column(c, justify="right")
    for r in rows:
        if "error" in r:
            t.add_row(escape(r.get("model", "")[:24]), escape(r.get("pattern", "")[:28]), str(r.get("tokens")),
                      r.get("mode", ""), r.get("protocol", ""), f"[red]{escape(r['error'][:60])}[/]")
            continue
        t.add_row(escape(r["model"][:24]), escape(r["pattern"][:28]), f"{r['tokens']:,}", r["mode"],
                  r.get("protocol", "-"), f"{r['ttft_ms']:.1f}", fmt(r.get("attention_ms"), 1),
                  fmt(r.get("other_ms"), 1), fmt(r.get("lookup_ms"), 3), fmt(r.get("decode_ms"), 2),
                  fmt(r.get("transfer_ms"), 2), fmt(r.get("cell_density"), 3), fmt(r.get("cells_over_allowed"), 3),
                  fmt(r.get("speedup"), 2), fmt(r.get("ttft_over_ideal"), 3),
                  fmt(r.get("ttft_over_ideal_computed"), 3), fmt(r.get("energy_j"), 2), fmt(r.get("tokens_per_j"), 0),
                  fmt(r.get("edp"), 3), fmt(r.get("ed2p"), 3))
    out.print(t)


def _block_ms(text: str) -> tuple[int | None, ...]:
    if text == "auto":
        return (None,)
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(x not in (64, 128) for x in sizes):
        raise SiftError(f"--block-m {text!r}: expected auto, 128, 64 or both (128,64)")
    return sizes


def _doc_tokens(text: str) -> int | tuple[int, int]:
    try:
        parts = [int(x) for x in text.split("-")]
    except ValueError:
        parts = []
    if len(parts) == 1 and parts[0] > 0:
        return parts[0]
    if len(parts) == 2 and 0 < parts[0] <= parts[1]:
        return parts[0], parts[1]
    raise SiftError(f"--doc-tokens {text!r}: expected a length (2048) or a range (300-3000)")


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
