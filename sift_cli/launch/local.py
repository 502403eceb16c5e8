"""`sift profile --gpus N`: N worker processes of the same command on this machine (ranks 0..N-1, one GPU each),
waited for and summed up; the manifest is written once every shard is there.

Each child is `python -m sift_cli.cli profile ARGS --rank i --world-size N --num-shards K --json`, where ARGS are
the options the parent was given (`command_argv` rebuilds them from the parsed command), so a child profiles
exactly as a worker started by hand would; its stdout is its JSON report, its stderr a log file.

The parent loads nothing its workers load again: no torch (it counts GPUs from CUDA_VISIBLE_DEVICES or NVML), no
model, and no corpus unless it must count documents for the shard count. Its children share the sift cache: the
converted GGUF weights (one conversion, under a lock, `models.py`) and Triton's and CuPy's compile caches
(`TRITON_CACHE_DIR`, `CUPY_CACHE_DIR` under it unless set). The summed report has each worker's start-up.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..cache import compile_cache_env
from ..corpus import CorpusFormat, load_corpus
from ..errors import SiftError
from ..sample import resolve_corpus
from ..shards.files import ShardFile, list_parts
from ..shards.manifest import write_manifest
from ..shards.format import MANIFEST, part_name
from .ranks import check_num_shards
from .startup import process_age

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
    from ..profile.job import default_num_shards  # here: the job module brings torch, which the parent avoids

    return default_num_shards(len(load_corpus(corpus, fmt).documents), docs_per_shard)


def _nvml_device_count() -> int | None:
    """GPUs NVML counts (no CUDA context, no torch: a few ms); None when NVML is missing or a GPU is in MIG mode
    (then CUDA's devices are not NVML's)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        n = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return None
        for i in range(n.value):
            handle, current, pending = ctypes.c_void_p(), ctypes.c_uint(0), ctypes.c_uint(0)
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                return None
            rc = nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending))
            if rc == 0 and current.value:
                return None
        return n.value
    except AttributeError:
        return None
    finally:
        nvml.nvmlShutdown()


def _cuda_device_count() -> int:
    n = _nvml_device_count()
    if n is not None:
        return n
    import torch  # fallback: torch's CUDA runtime (a second or two of import in the parent)

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_gpus(n: int, device: str | None) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES value of each of n local workers (None: leave it, for CPU workers). From this
    process's CUDA_VISIBLE_DEVICES when set, else NVML's device count (torch's without NVML), so that the parent
    does not import torch or create a CUDA context."""
    if device == "cpu":
        return [None] * n
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent is not None:
        ids = [x.strip() for x in parent.split(",") if x.strip()]
        ids = ids[:next((i for i, x in enumerate(ids) if x.startswith("-")), len(ids))]  # CUDA stops at "-1"
    else:
        ids = [str(i) for i in range(_cuda_device_count())]
    if not ids:
        raise SiftError(f"--gpus {n}: no CUDA GPU is visible on this machine (use --device cpu to run {n} CPU "
                        f"workers)")
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


def worker_env(env: Mapping[str, str], gpu: str | None) -> dict[str, str]:
    """A child worker's environment: no launcher rank variables (it gets --rank), its GPU, and the sift cache's
    compile caches unless the user set them."""
    child = dict(env)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID"):
        child.pop(k, None)
    if gpu is not None:
        child["CUDA_VISIBLE_DEVICES"] = gpu
    child.update(compile_cache_env(child))
    return child


def launch_local(base_argv: list[str], n: int, num_shards: int, device: str | None,
                 python: str | None = None, env: Mapping[str, str] | None = None,
                 log_dir: str | Path | None = None) -> list[WorkerResult]:
    """Run `sift profile` as n local worker processes (ranks 0..n-1 of n, one GPU each) and wait for all.

    base_argv: the profile command's arguments without rank/world options; each child gets `--rank i
    --world-size n --num-shards K --json` and CUDA_VISIBLE_DEVICES of its own GPU (so it uses cuda:0). A child's
    stderr goes to a log file; its stdout is its JSON report. Children share the sift cache's compile caches
    (`worker_env`).
    """
    gpus = visible_gpus(n, device)
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="sift-workers-"))
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(n):
        child_env = worker_env(os.environ if env is None else env, gpus[i])
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
    """Sum of the workers' JSON reports, with the workers' start-up (seconds: longest and mean)."""
    total = {"workers": len(results), "documents": 0, "profiled": 0, "reused": 0, "skipped_too_long": 0,
             "tokens": 0, "shards_written": 0, "shards_reused": 0}
    startups = []
    for r in results:
        if not r.report:
            continue
        total["documents"] = max(total["documents"], r.report.get("documents", 0))
        for k in ("profiled", "reused", "skipped_too_long", "tokens", "shards_written", "shards_reused"):
            total[k] += int(r.report.get(k, 0))
        if (r.report.get("startup") or {}).get("seconds") is not None:
            startups.append(float(r.report["startup"]["seconds"]))
    total["startup"] = {"worker_max_seconds": round(max(startups), 3) if startups else None,
                        "worker_mean_seconds": round(sum(startups) / len(startups), 3) if startups else None}
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
    t_call = time.perf_counter()
    n_shards = resolve_num_shards(corpus, fmt, out, num_shards, docs_per_shard)
    t0 = time.perf_counter()
    age = process_age()  # the parent's own start-up, until its workers start: seconds since it started
    launcher = age if age is not None else t0 - t_call
    results = launch_local(argv, gpus, n_shards, device)
    seconds = time.perf_counter() - t0
    total = merge_reports(results)
    total["startup"]["launcher_seconds"] = round(launcher, 3)
    manifest = None
    if all((out / part_name(s)).is_file() for s in range(n_shards)):
        manifest = str(out / MANIFEST) if (out / MANIFEST).is_file() else str(write_manifest(out))
    total.update(out=str(out), num_shards=n_shards, seconds=round(seconds, 3),
                 tokens_per_second=round(total["tokens"] / seconds, 1) if seconds > 0 else 0.0, manifest=manifest,
                 per_worker=[{"rank": r.rank, "returncode": r.returncode, "seconds": round(r.seconds, 3),
                              "tokens": (r.report or {}).get("tokens", 0), "startup": (r.report or {}).get("startup"),
                              "prepare": (r.report or {}).get("prepare"), "log": str(r.log)} for r in results])
    failed = [r for r in results if r.returncode != 0]
    if failed:
        r = failed[0]
        raise SiftError(f"{len(failed)} of {gpus} workers failed; worker {r.rank} exited {r.returncode}: "
                        f"{log_tail(r.log, 2) or 'no output'} (log: {r.log}); finished shards are kept: run the "
                        f"same command again to finish")
    return total
