"""`sift profile --gpus N`: N worker processes of the same command on this machine (ranks 0..N-1, one GPU each),
waited for and summed up; the manifest is written once every shard is there.

Each child is `python -m sift_cli.cli profile ARGS --rank i --world-size N --num-shards K --json`, where ARGS are
the options the parent was given (`command_argv` rebuilds them from the parsed command), so a child profiles
exactly as a worker started by hand would; its stdout is its JSON report, its stderr a log file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from ..corpus import CorpusFormat, load_documents
from ..errors import SiftError
from ..profile.job import default_num_shards
from ..sample import resolve_corpus
from ..shards.files import ShardFile, list_parts, write_manifest
from ..shards.format import MANIFEST, part_name
from .worker import check_num_shards

# parameters of `sift profile` a child does not inherit: it gets its own rank, world size, shard count and --json
CHILD_DROPS = {"gpus", "rank", "world_size", "num_shards", "as_json"}


def command_argv(ctx, drop: set[str]) -> list[str]:
    """Rebuild a command line from a typer (click) context's parsed parameters (minus `drop`), so that child
    workers get exactly the options this command was given, whatever options the command has."""
    args: list[str] = []
    positional: list[str] = []
    for p in ctx.command.params:
        if p.name in drop or p.name not in ctx.params:
            continue
        v = ctx.params[p.name]
        if getattr(p, "param_type_name", "") == "argument":
            positional.extend([str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)])
            continue
        if v is None or (isinstance(v, (list, tuple)) and not v):
            continue
        long = max(p.opts, key=len)
        if getattr(p, "is_flag", False):
            if v:
                args.append(long)
            elif p.secondary_opts:
                args.append(max(p.secondary_opts, key=len))
            continue
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            args.extend([long, str(x)])
    return positional + args


def resolve_num_shards(corpus, fmt, out: str | Path, num_shards: int | None, docs_per_shard: int) -> int:
    """The shard count workers must share: given, else that of the shards already in `out`, else one per
    `docs_per_shard` documents of the corpus (what a single `sift profile` would choose)."""
    if num_shards is not None:
        return num_shards
    parts = list_parts(Path(out)) if Path(out).is_dir() else []
    if parts:
        return int(ShardFile.open(parts[0]).meta["sift.num_shards"])
    return default_num_shards(len(load_documents(corpus, fmt)), docs_per_shard)


def visible_gpus(n: int, device: str | None) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES value of each of n local workers (None: leave it, for CPU workers)."""
    if device == "cpu":
        return [None] * n
    if not torch.cuda.is_available():
        raise SiftError(f"--gpus {n}: no CUDA GPU is visible on this machine (use --device cpu to run {n} CPU "
                        f"workers)")
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in parent.split(",") if x.strip()] if parent else \
        [str(i) for i in range(torch.cuda.device_count())]
    if n > len(ids):
        raise SiftError(f"--gpus {n}: only {len(ids)} CUDA devices are visible")
    return ids[:n]


@dataclass
class WorkerResult:
    rank: int
    returncode: int
    report: dict | None
    log: Path
    seconds: float


def launch_local(base_argv: list[str], n: int, num_shards: int, device: str | None,
                 python: str | None = None, env: Mapping[str, str] | None = None,
                 log_dir: str | Path | None = None) -> list[WorkerResult]:
    """Run `sift profile` as n local worker processes (ranks 0..n-1 of n, one GPU each) and wait for all.

    base_argv: the profile command's arguments without rank/world options; each child gets `--rank i
    --world-size n --num-shards K --json` and CUDA_VISIBLE_DEVICES of its own GPU (so it uses cuda:0). A child's
    stderr goes to a log file; its stdout is its JSON report.
    """
    gpus = visible_gpus(n, device)
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="sift-workers-"))
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(n):
        child_env = dict(os.environ if env is None else env)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID"):
            child_env.pop(k, None)
        if gpus[i] is not None:
            child_env["CUDA_VISIBLE_DEVICES"] = gpus[i]
        cmd = [python or sys.executable, "-m", "sift_cli.cli", "profile", *base_argv, "--rank", str(i),
               "--world-size", str(n), "--num-shards", str(num_shards), "--json"]
        if gpus[i] is not None:
            cmd += ["--device", "cuda"]  # its one visible GPU (a later --device wins over the one in base_argv)
        log = logs / f"worker-{i}.log"
        fh = open(log, "w")
        procs.append((i, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, env=child_env, text=True), fh,
                      log, time.perf_counter()))
    results = []
    for i, p, fh, log, t0 in procs:
        stdout, _ = p.communicate()
        fh.close()
        report = None
        try:
            report = json.loads(stdout) if stdout.strip() else None
        except ValueError:
            pass
        results.append(WorkerResult(i, p.returncode, report, log, time.perf_counter() - t0))
    return results


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def merge_reports(results: list[WorkerResult]) -> dict:
    """Sum of the workers' JSON reports."""
    total = {"workers": len(results), "documents": 0, "profiled": 0, "reused": 0, "skipped_too_long": 0,
             "tokens": 0, "shards_written": 0, "shards_reused": 0}
    for r in results:
        if not r.report:
            continue
        total["documents"] = max(total["documents"], r.report.get("documents", 0))
        for k in ("profiled", "reused", "skipped_too_long", "tokens", "shards_written", "shards_reused"):
            total[k] += int(r.report.get(k, 0))
    return total


def profile_with_local_workers(argv: list[str], gpus: int, corpus: str, out: str | Path, fmt: CorpusFormat,
                               num_shards: int | None, docs_per_shard: int, device: str | None,
                               rank: int | None = None, world_size: int | None = None) -> dict:
    """Profile `corpus` into `out` with `gpus` local worker processes; the summed report (what `sift profile
    --gpus N --json` prints). argv: the command's arguments (`command_argv`). A failed worker is a SiftError
    naming it and its log; the shards the others finished are kept."""
    corpus = resolve_corpus(corpus)
    check_num_shards(num_shards)
    if gpus < 1:
        raise SiftError("--gpus must be at least 1")
    if rank is not None or world_size is not None:
        raise SiftError("--gpus starts its own workers (ranks 0..N-1); drop --rank/--world-size")
    out = Path(out)
    n_shards = resolve_num_shards(corpus, fmt, out, num_shards, docs_per_shard)
    t0 = time.perf_counter()
    results = launch_local(argv, gpus, n_shards, device)
    seconds = time.perf_counter() - t0
    total = merge_reports(results)
    manifest = None
    if all((out / part_name(s)).is_file() for s in range(n_shards)):
        manifest = str(out / MANIFEST) if (out / MANIFEST).is_file() else str(write_manifest(out))
    total.update(out=str(out), num_shards=n_shards, seconds=round(seconds, 3),
                 tokens_per_second=round(total["tokens"] / seconds, 1) if seconds > 0 else 0.0, manifest=manifest,
                 per_worker=[{"rank": r.rank, "returncode": r.returncode, "seconds": round(r.seconds, 3),
                              "tokens": (r.report or {}).get("tokens", 0), "log": str(r.log)} for r in results])
    failed = [r for r in results if r.returncode != 0]
    if failed:
        r = failed[0]
        raise SiftError(f"{len(failed)} of {gpus} workers failed; worker {r.rank} exited {r.returncode}: "
                        f"{log_tail(r.log, 2) or 'no output'} (log: {r.log}); finished shards are kept: run the "
                        f"same command again to finish")
    return total
