"""`sift profile` on many GPUs and nodes: worker rank from flags or the scheduler's environment, the shard buckets
a rank owns, a per-bucket claim that keeps two processes from writing one shard, and `--gpus N` (N local workers).

Work is split by shard bucket, not by document: a document's bucket is a hash of its doc_id (`shards.shard_of`),
bucket ``s`` belongs to rank ``s % world_size``, and each bucket is one `part-NNNNN.parquet` written atomically.
So any number of workers, started in any order, any number of times, produce the same files as one worker would.

Claims. Before profiling a bucket a worker takes an exclusive lock on `.part-NNNNN.lock` in the output directory
(`fcntl.flock`; the kernel drops it when the process dies, SIGKILL included, so a dead worker never blocks a
bucket) and, holding it, checks again whether the shard is already finished. Two workers given the same rank
therefore never write the same shard at once: the second skips buckets held by the first, comes back to them at
the end and finds them done. The lock file is removed (while still locked) on release; a worker that locked an
already-removed file notices (its inode is no longer the path's) and retries. On file systems without `flock`
(some Lustre/NFS mounts) an O_EXCL lock file holding host, pid and a heartbeat is used instead; a lock whose
process is gone (same host) or whose heartbeat is older than `stale_after` seconds is broken.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from .errors import SiftError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


# ----------------------------------------------------------------------------------------------------------
# Rank
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerRank:
    rank: int
    world_size: int
    local_rank: int | None  # index of this worker's GPU on its node, when the launcher says
    source: str  # flags, torchrun, slurm-array, slurm-srun, slurm-array+srun, single

    def to_json(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "source": self.source}


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name)
    if v in (None, ""):
        return None
    try:
        return int(v)
    except ValueError:
        raise SiftError(f"environment variable {name}={v!r} is not an integer") from None


def detect_rank(rank: int | None = None, world_size: int | None = None,
                env: Mapping[str, str] | None = None) -> WorkerRank:
    """This worker's rank and the world size.

    Precedence: `--rank/--world-size`; torchrun (RANK, WORLD_SIZE, LOCAL_RANK); Slurm: a job array
    (SLURM_ARRAY_TASK_ID relative to SLURM_ARRAY_TASK_MIN and _STEP, of SLURM_ARRAY_TASK_COUNT tasks) and/or an
    `srun` step (SLURM_PROCID of SLURM_STEP_NUM_TASKS, falling back to SLURM_NTASKS only inside a step), combined
    as array_rank × step_tasks + procid; otherwise a single worker. A batch script's own shell (no `srun`) counts
    as one worker even when the allocation has several tasks, so nothing is silently left out.
    """
    env = os.environ if env is None else env
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise SiftError("--rank and --world-size go together")
        return _checked(WorkerRank(rank, world_size, None, "flags"))
    if env.get("RANK") not in (None, "") and env.get("WORLD_SIZE") not in (None, ""):
        return _checked(WorkerRank(_int_env(env, "RANK"), _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_RANK"),
                                   "torchrun"))
    in_step = env.get("SLURM_STEP_ID") not in (None, "", "batch", "extern") or "SLURM_STEP_NUM_TASKS" in env
    step_tasks = (_int_env(env, "SLURM_STEP_NUM_TASKS") or _int_env(env, "SLURM_NTASKS") or 1) if in_step else 1
    procid = (_int_env(env, "SLURM_PROCID") or 0) if in_step else 0
    local = _int_env(env, "SLURM_LOCALID") if in_step else None
    task = _int_env(env, "SLURM_ARRAY_TASK_ID")
    if task is not None and env.get("SLURM_ARRAY_TASK_COUNT"):
        count = _int_env(env, "SLURM_ARRAY_TASK_COUNT")
        first = _int_env(env, "SLURM_ARRAY_TASK_MIN") or 0
        step = _int_env(env, "SLURM_ARRAY_TASK_STEP") or 1
        if (task - first) % step or not 0 <= (task - first) // step < count:
            raise SiftError(f"Slurm array task {task} (min {first}, step {step}, count {count}) does not map to a "
                            f"rank; use a plain range (--array=0-{count - 1}) or pass --rank/--world-size")
        arr = (task - first) // step
        if step_tasks > 1:
            return _checked(WorkerRank(arr * step_tasks + procid, count * step_tasks, local, "slurm-array+srun"))
        return _checked(WorkerRank(arr, count, local, "slurm-array"))
    if step_tasks > 1:
        return _checked(WorkerRank(procid, step_tasks, local, "slurm-srun"))
    return WorkerRank(0, 1, local, "single")


def _checked(w: WorkerRank) -> WorkerRank:
    if w.world_size < 1 or not 0 <= w.rank < w.world_size:
        raise SiftError(f"rank {w.rank} of world size {w.world_size} (from {w.source}): need 0 <= rank < world size")
    return w


def owned_shards(num_shards: int, rank: int, world_size: int) -> set[int]:
    """Buckets of one rank: s % world_size == rank (round-robin, so ranks get near-equal counts)."""
    return {s for s in range(num_shards) if s % world_size == rank}


def worker_device(device: str | None, local_rank: int | None) -> str | None:
    """`--device auto|cuda` with a launcher-given local rank → cuda:LOCAL_RANK (modulo the visible GPUs, so a
    task that Slurm bound to one GPU uses cuda:0); anything explicit is kept."""
    if local_rank is None or device not in (None, "", "auto", "cuda"):
        return device
    import torch

    if not torch.cuda.is_available():
        return device
    return f"cuda:{local_rank % torch.cuda.device_count()}"


# ----------------------------------------------------------------------------------------------------------
# Per-bucket claims
# ----------------------------------------------------------------------------------------------------------

def lock_path(out: Path, shard: int, exclusive_file: bool = False) -> Path:
    """`.part-NNNNN.lock` (flock) or `.part-NNNNN.xlock` (the O_EXCL fallback's lock file)."""
    return Path(out) / f".part-{shard:05d}.{'xlock' if exclusive_file else 'lock'}"


def _flock_unsupported(exc: OSError) -> bool:
    return exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class BucketClaims:
    """Claims on the buckets of one output directory, for one process.

    `claim(shard, wait)` is a context manager yielding True when this process holds the bucket (then it may
    write the shard) and False when another live process does (only with wait=False).
    """

    def __init__(self, out: str | Path, stale_after: float = 600.0, heartbeat: float = 30.0):
        self.out = Path(out)
        self.stale_after = stale_after
        self.heartbeat = heartbeat
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "nonce": uuid.uuid4().hex}
        self.use_flock = fcntl is not None

    def __call__(self, shard: int, wait: bool = False):
        return self.claim(shard, wait)

    @contextlib.contextmanager
    def claim(self, shard: int, wait: bool = False) -> Iterator[bool]:
        self.out.mkdir(parents=True, exist_ok=True)
        release = self._acquire_flock(lock_path(self.out, shard), wait) if self.use_flock else None
        if release is None:  # no flock here (now or found out just now)
            release = self._acquire_exclusive(lock_path(self.out, shard, exclusive_file=True), wait)
        if release is False:
            yield False
            return
        try:
            remove_tmp_files(self.out, shard)  # left by a writer of this bucket that died; none is alive now
            yield True
        finally:
            release()

    # -- flock: released by the kernel when the process dies -----------------------------------------------
    def _acquire_flock(self, path: Path, wait: bool):
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError as exc:
                os.close(fd)
                if _flock_unsupported(exc):
                    self.use_flock = False
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    return None
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder before us removed the file after we opened it: lock the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(self.owner).encode())

            def release(fd=fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # while still locked: a waiter on this inode sees it is gone and retries
                os.close(fd)

            return release

    # -- O_EXCL fallback: owner info + heartbeat, stale locks broken -------------------------------------------
    def _acquire_exclusive(self, path: Path, wait: bool):
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if self._break_if_stale(path):
                    continue
                if not wait:
                    return False
                time.sleep(min(5.0, self.heartbeat))
                continue
            os.write(fd, json.dumps(self.owner).encode())
            os.close(fd)
            stop = threading.Event()

            def beat():
                while not stop.wait(self.heartbeat):
                    with contextlib.suppress(OSError):
                        os.utime(path)

            t = threading.Thread(target=beat, daemon=True)
            t.start()

            def release():
                stop.set()
                t.join()
                if _read_owner(path) == self.owner:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)

            return release

    def _break_if_stale(self, path: Path) -> bool:
        owner = _read_owner(path)
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return True
        if owner is None and age < 5:
            return False  # being written right now
        dead = (owner is not None and owner.get("host") == self.owner["host"]
                and not _pid_alive(int(owner.get("pid", -1))))
        if not dead and age < self.stale_after:
            return False
        aside = path.with_name(f"{path.name}.stale-{self.owner['nonce']}")
        try:
            os.rename(path, aside)  # atomic: of several breakers only one moves this file
        except FileNotFoundError:
            return True
        if _read_owner(aside) != owner:  # moved a lock taken after we looked: put it back unless replaced
            with contextlib.suppress(OSError):
                os.link(aside, path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)
        return True


def _read_owner(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_tmp_files(out: Path, shard: int) -> int:
    """Delete half-written temporaries of one bucket (`.part-NNNNN.parquet.*.tmp`), left by a killed writer."""
    n = 0
    for p in Path(out).glob(f".part-{shard:05d}.parquet.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n


def busy_buckets(out: str | Path) -> list[int]:
    """Buckets some live process holds right now (a flock lock that is held; any O_EXCL lock file)."""
    held = []
    for p in sorted(Path(out).glob(".part-*.*lock")):
        try:
            shard = int(p.name[len(".part-"):].split(".", 1)[0])
        except ValueError:
            continue
        if fcntl is None or p.suffix == ".xlock":
            held.append(shard)
            continue
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(shard)
        except OSError:
            held.append(shard)
        finally:
            os.close(fd)
    return sorted(set(held))


def clean_leftovers(out: str | Path) -> int:
    """After every shard is done: remove unheld lock files and orphan temporaries. Returns how many."""
    out = Path(out)
    busy = set(busy_buckets(out))
    n = 0
    for p in list(out.glob(".part-*.lock")) + list(out.glob(".part-*.parquet.*.tmp")):  # never .xlock
        try:
            shard = int(p.name[len(".part-"):].split(".", 1)[0])
        except ValueError:
            continue
        if shard in busy:
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n


# ----------------------------------------------------------------------------------------------------------
# --gpus N: local workers
# ----------------------------------------------------------------------------------------------------------

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
    from .shards import ShardFile, list_parts

    if num_shards is not None:
        return num_shards
    parts = list_parts(Path(out)) if Path(out).is_dir() else []
    if parts:
        return int(ShardFile.open(parts[0]).meta["sift.num_shards"])
    from .corpus import load_documents
    from .profile.job import default_num_shards

    return default_num_shards(len(load_documents(corpus, fmt)), docs_per_shard)


def visible_gpus(n: int, device: str | None) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES value of each of n local workers (None: leave it, for CPU workers)."""
    if device == "cpu":
        return [None] * n
    import torch

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
