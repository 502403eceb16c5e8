"""Optional Ray launcher for `sift profile`: one Ray task per worker (one GPU each), each running the same worker
function as `sift profile --rank R --world-size W` (`worker.ProfileWorker`: load the model, profile the buckets
`s % W == R` through `profile.job.profile_corpus`, with the same per-bucket claims). Requires
`pip install 'sift-cli[ray]'`.

    from sift_cli.launch.ray_tasks import profile_with_ray
    summary = profile_with_ray("corpus.jsonl", "/shared/shards", num_workers=16, num_shards=512,
                               model="/shared/models/Meta-Llama-3-8B-Instruct", address="auto")

Tasks are independent, so a task that fails (node lost) can be retried by Ray (`max_retries`) or the whole call
re-run: finished shards are skipped, as with every other launcher (docs/scaling.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..corpus import CorpusFormat
from ..errors import SiftError
from ..shards.manifest import write_manifest
from ..shards.format import part_name
from .worker import ProfileWorker


def run_worker(corpus: str, out: str, rank: int, world_size: int, num_shards: int, model: str | None = None,
               device: str | None = "auto", dtype: str | None = "auto", config: dict | None = None,
               corpus_format: dict | None = None, prefix_text: str | None = None, strict: bool = False) -> dict:
    """One Ray task: the buckets of `rank` of `world_size`, written to `out`; returns the job report as a dict.

    config: ProfileConfig fields (tile, alpha, beta, gamma, batch_tokens, stats, ...) over the device defaults
    (sift.toml is not read); corpus_format: CorpusFormat fields."""
    worker = ProfileWorker.start(corpus, out, model=model, device=device, dtype=dtype, flags=config,
                                 fmt=CorpusFormat(**(corpus_format or {})), num_shards=num_shards, strict=strict,
                                 prefix_text=prefix_text, rank=rank, world_size=world_size)
    report = worker.run()
    return {**report.to_json(), "rank": rank, "world_size": world_size, "device": str(worker.lm.device),
            "host": os.uname().nodename}


def profile_with_ray(corpus: str | Path, out: str | Path, num_workers: int, num_shards: int,
                     model: str | None = None, gpus_per_worker: float = 1.0, cpus_per_worker: float = 1.0,
                     address: str | None = None, max_retries: int = 2, init_kwargs: dict | None = None,
                     **worker_kwargs) -> dict:
    """Profile `corpus` into `out` with `num_workers` Ray tasks; write the manifest; return a summary.

    gpus_per_worker=0 runs CPU workers (pass device="cpu"). address: an existing Ray cluster ("auto"), or None to
    start a local one. Paths must be visible to every node (a shared file system)."""
    try:
        import ray
    except ImportError as exc:
        raise SiftError("the Ray launcher needs ray: pip install 'sift-cli[ray]'") from exc
    if num_workers < 1 or num_shards < 1:
        raise SiftError("num_workers and num_shards must be at least 1")
    corpus, out = str(Path(corpus).resolve()), str(Path(out).resolve())
    started = False
    if not ray.is_initialized():
        ray.init(address=address, **(init_kwargs or {}))
        started = True
    try:
        task = ray.remote(run_worker).options(num_gpus=gpus_per_worker, num_cpus=cpus_per_worker,
                                              max_retries=max_retries)
        refs = [task.remote(corpus, out, rank, num_workers, num_shards, model=model, **worker_kwargs)
                for rank in range(num_workers)]
        reports = ray.get(refs)
    finally:
        if started:
            ray.shutdown()
    outp = Path(out)
    done = all((outp / part_name(s)).is_file() for s in range(num_shards))
    manifest = str(write_manifest(outp)) if done else None
    return {"workers": num_workers, "num_shards": num_shards, "manifest": manifest,
            "profiled": sum(r["profiled"] for r in reports), "tokens": sum(r["tokens"] for r in reports),
            "shards_written": sum(r["shards_written"] for r in reports), "per_worker": reports}
