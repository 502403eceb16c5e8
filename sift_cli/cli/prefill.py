"""`sift prefill` (and the demo's `sift demo-prefill`): full recompute and SIFT on one prompt, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .console import err, out, pct, print_json, progress
from .options import DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, OnlineOpt, TrustOpt

PROFILE_MISSING_FAILED = 5  # exit code: the prefill ran and its report is printed; --profile-missing failed after


def prefill(
    shards_dir: Path = typer.Option(..., "--shards", help="shard directory made by `sift profile`"),
    docs: Path = typer.Option(..., "--docs", help="the prompt's documents in order: a file with one doc_id or "
                                                  ".txt/.md file per line, or a JSONL of {id[, text, title]}; "
                                                  "documents no shard set holds are computed densely"),
    query: Path = typer.Option(..., "--query", help="file holding the user's question"),
    model: Optional[str] = ModelOpt,
    backend: str = typer.Option("auto", "--backend", help="auto (cuda on Hopper, flex on other GPUs, gather on "
                                                          "CPU), gather, reference (checking only), flex or cuda"),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", help="answer tokens generated after the prefill "
                                                                 "(0: none, the first-token check only)"),
    repeat: Optional[int] = typer.Option(None, "--repeat", help="timed runs of each mode, median reported "
                                                                "(default: 3 on a GPU and for prompts up to 1,024 "
                                                                "tokens on a CPU, else 1: no speed-up printed)"),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="untimed runs of each mode first (default: 1 "
                                                                "where --repeat defaults to 3, else 0)"),
    block_m: Optional[int] = typer.Option(None, "--block-m", help="query block rows (default: the backend's "
                                                                  "choice, docs/kernels.md)"),
    block_n: int = typer.Option(64, "--block-n", help="KV block size (64 or 128)"),
    query_blocks: str = typer.Option("auto", "--query-blocks", help="query blocks cut per segment (segment), on "
                                                                   "the global grid (grid), or as the backend "
                                                                   "chooses for the prompt's bits (auto)"),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="capture each mode's prefill as a CUDA graph "
                                                                  "and time its replays (capture reported apart)"),
    template: Optional[str] = typer.Option(None, "--template", help="template of documents given as text, as "
                                                                    "`sift profile --template` (default: its own)"),
    profile_missing: Optional[Path] = typer.Option(None, "--profile-missing", help="shard set the prompt also "
                                                   "reads, where documents no set holds are profiled afterwards "
                                                   "for the next prompt (created if needed)"),
    noise_floor: bool = typer.Option(True, "--noise-floor/--no-noise-floor", help="also run full recompute in a "
                                     "reference precision (untimed) and report SIFT's KL as a multiple of that "
                                     "numeric noise (docs/evaluation.md)"),
    trust_remote_code: bool = TrustOpt,
    online: bool = OnlineOpt,
    as_json: bool = JsonOpt,
):
    """Assemble a RAG prompt from profiled documents; run full recompute and SIFT side by side."""
    from ..corpus import corpus_format
    from ..prefill.inputs import read_documents, read_query
    from ..prefill.options import PrefillOptions

    documents, question = read_documents(docs, corpus_format(template=template)), read_query(query)
    opts = PrefillOptions(backend=backend, block_m=block_m, block_n=block_n, query_blocks=query_blocks,
                          cuda_graphs=cuda_graphs, repeat=repeat, warmup=warmup, max_new_tokens=max_new_tokens,
                          noise_floor=noise_floor)
    _run_prefill(shards_dir, documents, question, model, device, dtype, opts, trust_remote_code, online, as_json,
                 profile_missing)


def _run_prefill(shards_dir, docs, question, model, device, dtype, opts, trust_remote_code=False, online=False,
                 as_json=False, profile_missing=None):
    from ..prefill.job import prefill_from_shards

    with progress("prefill", not as_json, unit="forwards") as update:  # on a terminal only
        report = prefill_from_shards(shards_dir, docs, question, model, device, dtype, opts, trust_remote_code,
                                     online, progress=update, profile_missing=profile_missing)
    if as_json:
        print_json(report)
    else:
        render_prefill(report, question)
    failed = (report.get("profiled_missing") or {}).get("error")
    if failed:  # the prefill's report is out; profiling its missing documents for the next prompt failed
        err.print(f"[red]error:[/] profiling the missing documents into {escape(str(profile_missing))} failed: "
                  f"{escape(failed)}")
        raise typer.Exit(PROFILE_MISSING_FAILED)


def _rule(r: dict) -> str:
    sel = r.get("selection") or {}
    return f", mass rule ε={sel['epsilon']:g} ε'={sel['ca_epsilon']:g}" if sel.get("rule") == "mass" else ""


def render_prefill(r: dict, question: str) -> None:
    from ..prefill.noise import noise_line

    pt = r["prompt_tokens"]
    out.print(f"[bold]prompt[/]: {pt['total']} tokens = prefix {pt['prefix']} + {len(pt['docs'])} documents "
              f"{pt['docs']} + suffix {pt['suffix']}   ({r['model']}, {r['device']}, {r['dtype']})")
    d = r["density"]
    out.print(f"[bold]attention computed[/]: {pct(d['blocks'])} of causal {r['block_m']}×{r['block_n']} blocks "
              f"({r['query_blocks']} query blocks), {pct(d['cells'])} of causal cells, "
              f"{d['cells_over_allowed']:.3f}× the pairs the bits allow (T={r['tile_size']}{_rule(r)}, backend "
              f"{r['backend']})")
    if r["dense_docs"]:
        listed = ", ".join(f"{escape(x['doc_id'])} ({x['reason']})" for x in r["dense_docs"])
        out.print(f"[bold]dense documents[/]: {listed}: {pct(d['dense_docs_cells_share'])} of the computed cells")
    if r.get("causal_kernel"):
        out.print("no document has bits, so SIFT's mask is the causal mask: it ran full recompute's kernel")
    gpu = r["dense"]["gpu_ms"] is not None
    table = Table(show_edge=False)
    cols = ("", "TTFT ms") + (("host ms", "GPU ms", "bound by") if gpu else ()) + ("answer",)
    for col in cols:
        table.add_column(col, no_wrap=col != "answer")
    for name, t in (("full recompute", r["dense"]), ("SIFT", r["sift"])):
        timing = (f"{t['host_ms']:.1f}", f"{t['gpu_ms']:.1f}", t["bound"] or "") if gpu else ()
        table.add_row(name, f"{t['ttft_ms']:.1f}", *timing, escape(t["text"].strip()))
    out.print(f"[bold]question[/]: {escape(question)}")
    out.print(table)
    decode = (f"decode {r['decode_ms']:.2f} ms ({pct(r['decode_share_of_ttft'])} of SIFT TTFT)   "
              if r["decode_ms"] is not None else "")
    if r["sift"].get("lookup_ms") is not None:
        decode = (f"bits lookup {r['sift']['lookup_ms']:.3f} ms ({pct(r['lookup_share_of_ttft'])} of SIFT TTFT)   "
                  + decode)
    t = r.get("timing") or {}
    speed = (f"speed-up {r['speedup']:.2f}× (median of {t.get('repeat')} runs after {t.get('warmup')} warm-up"
             f"{'s' * (t.get('warmup') != 1)})   "
             if r["speedup"] is not None else "")
    out.print(f"{speed}{decode}first token "
              f"{'same' if r['first_token_match'] else 'DIFFERENT'}   KL {r['kl']:.2e}   "
              f"max |Δlogit| {r['max_abs_logit_diff']:.3f}")
    if t.get("speedup_withheld"):
        out.print(f"[dim]{escape(t['speedup_withheld'])}[/]")
    if r.get("noise_floor"):
        out.print(noise_line(r["noise_floor"]))
    if r.get("cuda_graphs"):
        c = r["capture_ms"]
        out.print(f"CUDA graphs: capture {c['dense']:.0f} ms (full) and {c['sift']:.0f} ms (SIFT), not in TTFT; graph "
                  f"logits {'equal' if r['graph_logits_equal_eager'] else 'DIFFER FROM'} eager SIFT's")
    added = r.get("profiled_missing")
    if added is not None and "error" not in added:
        extra = "".join(f", {len(added[k])} {k.replace('_', ' ')}" for k in ("conflicts", "skipped_too_long")
                        if added[k])
        out.print(f"profiled for the next prompt: {len(added['added'])} documents into {escape(added['out'])} "
                  f"({added['seconds']:.1f} s{extra})")
    store = r.get("store")
    if store is not None:
        out.print(f"[dim]shard sets opened in {store['open_ms']:.1f} ms, read through "
                  f"{'the serving store' if store['read_path'] == 'store' else 'their Parquet files'} "
                  f"(not in TTFT; the lookup of the prompt's bits is)[/]")
        for hint in store["hints"]:
            err.print(f"[yellow]hint[/]: {escape(hint)}")
    if r["backend"] == "reference":
        out.print("[dim]The reference backend checks correctness; it is not a speed path (it computes every score "
                  "and masks). Timings that matter need --backend cuda or flex on a GPU.[/]")


def demo_prefill(
    shards_dir: Path = typer.Option(..., "--shards"),
    device: str = DeviceOpt,
):
    """Answer the built-in sample questions from shards of the built-in sample corpus."""
    from ..prefill.job import sample_prefills

    with progress("prefill", unit="forwards") as update:
        reports = sample_prefills(shards_dir, device, progress=update)
    for r in reports:
        render_prefill(r, r["question"])
        out.print()
    same = sum(r["first_token_match"] for r in reports)
    cells = [r["density"]["cells"] for r in reports]
    out.print(f"[bold]the check[/]: SIFT's first token equals full recompute's in {same} of {len(reports)} prompts, "
              f"KL(full ‖ SIFT) at the last position ≤ {max(r['kl'] for r in reports):.1e}, computing "
              f"{pct(min(cells))}–{pct(max(cells))} of the attention cells (expected answers: "
              f"{', '.join(r['expected'] for r in reports)})")
    if reports and reports[0]["dense"]["gpu_ms"] is None:
        out.print("[dim]On a CPU that agreement is the point; speed-ups need a GPU backend (docs/benchmarks.md).[/]")
