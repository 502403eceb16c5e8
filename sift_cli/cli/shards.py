"""Shard commands: `sift inspect`, `validate`, `status`, `ids`, `index` and `sift sample-corpus`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .console import err, human_bytes, out, pct, print_json, print_plain
from .options import JsonOpt

DocsOpt = typer.Option(None, "--docs", help="a prompt's documents (as for sift prefill --docs): say which of its "
                                            "ids the set lacks")


def inspect(
    path: Path = typer.Argument(..., help="a shard file or a shard directory"),
    doc: Optional[str] = typer.Option(None, "--doc", help="draw this document's tile map"),
    layer: int = typer.Option(0, "--layer"),
    head: int = typer.Option(0, "--head"),
    workers: Optional[int] = typer.Option(None, "--workers", help="files read in parallel (default: the CPU "
                                                                   "count, at most 8)"),
    as_json: bool = JsonOpt,
):
    """Sparsity statistics of shards (overall and per layer) and metadata size against the KV cache."""
    from ..shards.inspection import draw_tile_map, inspect_shards, tile_map
    from ..shards.validate import default_workers

    if doc is not None:
        tm = tile_map(path, doc, layer, head)
        if as_json:
            print_json(tm)
        else:
            out.print(draw_tile_map(tm))
        return
    if workers is not None and workers < 1:
        raise typer.BadParameter("--workers must be at least 1")
    s = inspect_shards(path, workers or default_workers())
    if as_json:
        print_json(s)
        return
    out.print(f"[bold]{s['path']}[/]: {s['files']} files, {s['documents']} documents, {s['tokens']:,} tokens "
              f"(per document {s['tokens_min']}..{s['tokens_max']}, mean {s['tokens_mean']:.0f})")
    out.print(f"  model {s['model']['name']}  ({s['n_layers']} layers × {s['n_heads']} heads, "
              f"{s['n_kv_heads']} KV heads, head_dim {s['head_dim']})")
    rule = (f"rule mass  ε={s['epsilon']}  ε'={s['ca_epsilon']}" if s["rule"] == "mass"
            else f"rule paper  α={s['alpha']}  β={s['beta']}  γ={s['gamma']}")
    out.print(f"  T={s['tile_size']}  {rule}  "
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


def validate(
    path: Path = typer.Argument(..., help="a shard file or a shard directory"),
    workers: Optional[int] = typer.Option(None, "--workers", help="files checked in parallel (default: the CPU "
                                                                   "count, at most 8)"),
    as_json: bool = JsonOpt,
):
    """Check shards: schema, bit-vector lengths, token hashes, duplicates, metadata, manifest and serving store.
    Exit 1 on problems; --json lists each with a code, its file, doc_id and row where there is one."""
    from ..shards.validate import validate_path

    if workers is not None and workers < 1:
        raise typer.BadParameter("--workers must be at least 1")
    result = validate_path(path, workers)
    if as_json:
        print_json(result)
    elif result["ok"]:
        out.print(f"[green]ok[/]: {result['path']}: {result['files']} files, {result['documents']} documents")
    else:
        err.print(f"[red]{len(result['problems'])} problems[/] in {result['path']}:")
        for p in result["problems"]:
            err.print(f"  - {escape(p['message'])}")
    if not result["ok"]:
        raise typer.Exit(1)


def status(
    path: Path = typer.Argument(..., help="a shard directory"),
    finalize: bool = typer.Option(False, "--finalize", help="write the manifest when every shard is done"),
    docs: Optional[Path] = DocsOpt,
    as_json: bool = JsonOpt,
):
    """Which shards of a directory are done, in progress (held by a live worker) and missing; --finalize writes
    the manifest (and removes leftover lock and temporary files); --docs: which of a prompt's ids it lacks."""
    from ..shards.recovery import advice
    from ..shards.status import shard_status

    result = shard_status(path, finalize)
    prompt = _prompt_ids(path, docs)
    if prompt is not None:
        result["prompt"] = {k: v for k, v in prompt.items() if k != "entries"}
    n, missing, running, bad = result["num_shards"], result["missing"], result["running"], result["bad"]
    if as_json:
        print_json(result)
    else:
        out.print(f"{path}: {result['done']}/{n} shards done" + (f"; missing {missing[:10]}" if missing else "")
                  + (f" ({len(running)} in progress: {running[:10]})" if running else "")
                  + (f"; manifest {result['manifest']}" if result["manifest"] else "; no manifest yet"))
        for b in bad:
            err.print(f"  [yellow]{escape(b['file'])}[/]: {escape(b['problem'])} — not done; "
                      + escape(advice("unreadable-part", path, b["file"])))
        if missing and not bad:
            err.print(escape(f"  {advice('interrupted-run', path)}"))
        _print_worker_runs(result.get("workers") or [])
        if prompt is not None:
            out.print(escape(_prompt_line(prompt, path)
                             + (f": {', '.join(prompt['missing_ids'][:10])}" if prompt["missing"] else "")))
    if missing:
        raise typer.Exit(3)


def _print_worker_runs(records: list[dict], limit: int = 8) -> None:
    """The worker runs that profiled into the directory, with their start-up (the slowest first when many)."""
    from statistics import median

    from ..launch.startup import top_phases

    if not records:
        return
    secs = [r["startup"]["seconds"] for r in records if (r.get("startup") or {}).get("seconds") is not None]
    out.print(f"  {len(records)} worker run{'s' if len(records) != 1 else ''}"
              + (f"; start-up {min(secs):.1f}–{max(secs):.1f} s, median {median(secs):.1f} s" if secs else ""))
    shown = records if len(records) <= limit else \
        sorted(records, key=lambda r: -((r.get("startup") or {}).get("seconds") or 0))[:limit]
    for r in shown:
        st = r.get("startup") or {}
        phases = ", ".join(f"{k} {v:.1f}" for k, v in top_phases(st, 3))
        did = (f"{len(r.get('shards_written') or [])} shards, {r.get('tokens') or 0:,} tokens in "
               f"{r.get('seconds') or 0:.1f} s" if r.get("state") == "finished" else r.get("state"))
        out.print(escape(f"    {r.get('started_at')} rank {r.get('rank')}/{r.get('world_size')} on {r.get('host')} "
                         f"({r.get('device')}): start-up {st.get('seconds') or 0:.1f} s ({phases}); {did}"))
    if len(records) > limit:
        out.print(f"    ... {len(records) - limit} more (--json lists every run)")


def ids(
    path: Path = typer.Argument(..., help="a shard file or a shard directory (finished or not)"),
    docs: Optional[Path] = DocsOpt,
    as_json: bool = JsonOpt,
):
    """Every doc_id of a shard set with its status: profiled (file, tokens) or skipped at profile time (and why).
    One tab-separated line per id on stdout (--json: one JSON object per line), streamed in doc_id order; the
    counts on stderr. With --docs, only the prompt's ids (absent: never seen)."""
    from ..shards.ids import DocIdListing

    if docs is not None:
        prompt = _prompt_ids(path, docs)
        if as_json:
            print_json({"path": str(path), "prompt": prompt})
            return
        print_plain(_id_line(r) for r in prompt["entries"])
        err.print(_prompt_line(prompt, path))
        return
    listing = DocIdListing(path)
    if as_json:
        print_plain(json.dumps(r) for r in listing)
    else:
        print_plain(_id_line(r) for r in listing)
    err.print(f"{listing.profiled} profiled, {listing.skipped} skipped, in {listing.files} files")


def _id_line(r: dict) -> str:
    return (f"{r['doc_id']}\t{r['status']}\t"
            + (f"{r['file']}\t{r['n_tokens']} tokens" if r["status"] == "profiled" else r.get("reason", "")))


def _prompt_ids(path: Path, docs: Optional[Path]) -> dict | None:
    if docs is None:
        return None
    from ..corpus import Document
    from ..prefill.assemble import doc_id_of
    from ..prefill.inputs import read_documents
    from ..shards.ids import prompt_ids_report

    entries = read_documents(docs)
    names = [doc_id_of(d) for d in entries]
    return prompt_ids_report(path, names, {d.doc_id for d in entries if isinstance(d, Document)})


def _prompt_line(p: dict, path) -> str:
    line = f"{p['missing']} of the {p['named']} ids the prompt names are missing from {path}"
    if p["missing"]:
        line += f" ({p['skipped']} skipped at profile time, {p['absent']} never profiled"
        line += f"; {len(p['with_text'])} given as text, computed densely)" if p["with_text"] else ")"
    return line


def index(
    path: Path = typer.Argument(..., help="a shard directory"),
    workers: int = typer.Option(1, "--workers", help="processes building bucket files in parallel"),
    rebuild: bool = typer.Option(False, "--rebuild", help="rebuild every bucket file, current ones too"),
    verify: bool = typer.Option(False, "--verify", help="also read every record's checksum, rebuilding the bucket "
                                                        "files with a damaged one"),
    as_json: bool = JsonOpt,
):
    """Build the set's serving store (store/: point reads of a document's bits), or bring it up to date: every
    bucket file that is missing or stale is built from its part file. `sift profile` writes it as it goes; this
    migrates sets made before, and repairs a damaged store."""
    from ..store.index import index_set

    if workers < 1:
        raise typer.BadParameter("--workers must be at least 1")
    r = index_set(path, workers=workers, rebuild=rebuild, verify=verify)
    if as_json:
        print_json(r)
    else:
        out.print(f"{escape(str(path))}: serving store up to date — {r['built']} of {r['buckets']} bucket files built"
                  f", {r['current']} already current" + (f", {r['removed']} removed" if r["removed"] else "")
                  + f" ({r['seconds']:.1f} s)")


def sample_corpus(directory: Path = typer.Argument(..., help="where to write the .txt files")):
    """Write the built-in sample corpus (Python standard-library documentation) to a directory."""
    from ..sample import write_sample_corpus

    p = write_sample_corpus(directory)
    out.print(f"wrote {len(list(p.glob('*.txt')))} documents to {p}")
