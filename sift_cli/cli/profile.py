"""`sift profile`: one worker in this process (its rank from flags, torchrun or Slurm), or `--gpus N` local
workers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..shards.recovery import advice
from .console import Interrupted, err, out, print_json, progress
from .options import (DeviceOpt, DtypeOpt, IdFieldOpt, JsonOpt, ModelOpt, OnlineOpt, TemplateOpt, TextFieldOpt,
                      TitleFieldOpt, TrustOpt)


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
    rule: Optional[str] = typer.Option(None, "--rule", help="how tiles and pages are chosen: paper (thresholds α, "
                                                            "β, γ; the default) or mass (bounds ε, ε' on the "
                                                            "attention mass dropped; docs/evaluation.md)"),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="--rule mass: the most attention mass a "
                                                                    "document query row drops (default 0.02)"),
    ca_epsilon: Optional[float] = typer.Option(None, "--ca-epsilon", help="--rule mass: the largest share of a "
                                                                          "document's mean later-query mass its "
                                                                          "CA pages drop (default 0.05)"),
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
    id_field: str = IdFieldOpt,
    text_field: str = TextFieldOpt,
    title_field: str = TitleFieldOpt,
    template: Optional[str] = TemplateOpt,
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
    from ..corpus import corpus_format

    fmt = corpus_format(id_field, text_field, title_field, template)
    if gpus:  # the launcher imports no torch: its workers do
        from ..launch.local import CHILD_DROPS, command_argv, profile_with_local_workers

        total = profile_with_local_workers(command_argv(ctx, CHILD_DROPS), gpus, corpus, out_dir, fmt, num_shards,
                                           docs_per_shard, device, rank, world_size)
        return _render_local_workers(total, as_json)
    from ..launch.worker import ProfileWorker

    worker = ProfileWorker.start(corpus, out_dir, model=model, device=device, dtype=dtype,
                                 trust_remote_code=trust_remote_code, online=online,
                                 flags={"tile": tile, "alpha": alpha, "beta": beta, "gamma": gamma,
                                        "batch_tokens": batch_tokens, "stats": stats, "rule": rule,
                                        "epsilon": epsilon, "ca_epsilon": ca_epsilon},
                                 read_config_file=True, config_file=config, fmt=fmt, num_shards=num_shards,
                                 docs_per_shard=docs_per_shard, strict=strict, prefix_text=prefix_text, rank=rank,
                                 world_size=world_size, from_process_start=True)
    if worker.config.warning and not as_json:
        err.print(f"[yellow]warning:[/] {escape(worker.config.warning)}")
    try:
        with progress("profiling", not as_json, unit="tokens") as update:
            report = worker.run(update)
    except KeyboardInterrupt:
        raise Interrupted("run the same command again to resume: finished shards are kept, the others are "
                          "redone") from None
    except OSError as exc:
        from ..output_dirs import disk_full_error, is_disk_full

        if is_disk_full(exc):
            raise disk_full_error(exc, out_dir) from exc
        raise
    lm, rank_ = worker.lm, worker.rank
    if as_json:
        print_json({**report.to_json(), "worker": rank_.to_json(), "device": str(lm.device)})
        return
    if rank_.world_size > 1:
        out.print(f"worker {rank_.rank} of {rank_.world_size} ({rank_.source}): {len(worker.only_shards)} of "
                  f"{report.num_shards} shards are this worker's")
    # the corpus's records, bad ones included (report.documents counts the readable ones, too long ones included)
    records = report.documents + len(report.skipped) - len(report.skipped_too_long)
    skipped = f" ({len(report.skipped)} skipped, below)" if report.skipped else ""
    out.print(f"[bold]{report.out}[/]: {records} documents in {report.num_shards} shards{skipped}")
    out.print(f"  profiled {report.profiled} documents ({report.tokens} tokens) in {report.seconds:.1f} s "
              f"= {report.tokens_per_second:,.0f} tokens/s on {lm.device}")
    if report.startup:
        prep = report.prepare
        out.print(f"  start-up {_startup_line(report.startup)}; then read the corpus in "
                  f"{prep.get('read_corpus', 0):.1f} s, tokenised in {prep.get('tokenize', 0):.1f} s")
    if report.reused:
        out.print(f"  reused {report.reused} documents from {report.shards_reused} finished shards")
    _print_skipped(report)
    for a in report.set_aside:
        held = "an unknown number of" if a["documents"] is None else a["documents"]
        out.print(escape(f"  set aside {a['file']} (unreadable, {held} documents; {a['recovered']} added ones "
                         f"recovered from the store): " + advice("set-aside", report.out, a["aside"])))
    if report.manifest:
        out.print(f"  manifest: {report.manifest}")


def _print_skipped(report, limit: int = 10) -> None:
    """The documents not profiled and the files that are not documents, each with its reason."""
    if report.skipped:
        _print_listed(f"[yellow]skipped {len(report.skipped)} documents[/] (not profiled; `sift ids {report.out}` "
                      "lists them with the reason; --strict stops instead):",
                      [f"{s['origin']}: {s['reason']}" for s in report.skipped], limit,
                      f" (--json lists {min(100, len(report.skipped))})")
    if report.ignored_files:
        _print_listed(f"[yellow]ignored {len(report.ignored_files)} files[/] that are not documents:",
                      report.ignored_files, limit)


def _print_listed(head: str, lines: list[str], limit: int, more: str = "") -> None:
    """A heading, then the first `limit` lines (escaped: they quote file names and reasons) and how many more."""
    out.print(f"  {head}")
    for line in lines[:limit]:
        out.print(escape(f"    {line}"))
    if len(lines) > limit:
        out.print(f"    ... {len(lines) - limit} more{more}")


def _startup_line(startup: dict) -> str:
    from ..launch.startup import top_phases

    phases = ", ".join(f"{k} {v:.1f}" for k, v in top_phases(startup))
    return f"{startup['seconds']:.1f} s" + (f" ({phases})" if phases else "")


def _render_local_workers(total: dict, as_json: bool) -> None:
    if as_json:
        print_json(total)
        return
    out.print(f"[bold]{total['out']}[/]: {total['documents']} documents in {total['num_shards']} shards, "
              f"{total['workers']} workers")
    out.print(f"  profiled {total['profiled']} documents ({total['tokens']} tokens) in {total['seconds']:.1f} s "
              f"= {total['tokens_per_second']:,.0f} tokens/s")
    for w in total["per_worker"]:
        if w.get("startup"):
            out.print(f"  worker {w['rank']}: start-up {_startup_line(w['startup'])}")
    if total["reused"]:
        out.print(f"  reused {total['reused']} documents from {total['shards_reused']} finished shards")
    if total["manifest"]:
        out.print(f"  manifest: {total['manifest']}")
