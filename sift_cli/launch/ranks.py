"""Which worker this process is: its rank and the world size from `--rank/--world-size`, torchrun's variables or
Slurm's (job arrays, `srun` steps, or both), the shard buckets a rank owns, and the GPU it uses.

Work is split by shard bucket, not by document: a document's bucket is a hash of its doc_id
(`shards.format.shard_of`), bucket ``s`` belongs to rank ``s % world_size``, and each bucket is one
`part-NNNNN.parquet` written atomically. So any number of workers, started in any order, any number of times,
produce the same files as one worker would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..errors import SiftError


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


def check_num_shards(num_shards: int | None) -> None:
    if num_shards is not None and num_shards < 1:
        raise SiftError("--num-shards must be at least 1")


def owned_shards(num_shards: int, rank: int, world_size: int) -> set[int]:
    """Buckets of one rank: s % world_size == rank (round-robin, so ranks get near-equal counts)."""
    return {s for s in range(num_shards) if s % world_size == rank}


def worker_device(device: str | None, local_rank: int | None) -> str | None:
    """`--device auto|cuda` with a launcher-given local rank → cuda:LOCAL_RANK (modulo the visible GPUs, so a
    task that Slurm bound to one GPU uses cuda:0); anything explicit is kept."""
    if local_rank is None or device not in (None, "", "auto", "cuda"):
        return device
    import torch  # here: the launcher side of this module needs no torch

    if not torch.cuda.is_available():
        return device
    return f"cuda:{local_rank % torch.cuda.device_count()}"
