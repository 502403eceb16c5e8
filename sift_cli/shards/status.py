"""`sift status`: which shards of a directory are done, in progress (held by a live worker) and missing; finalising
writes the manifest and removes leftover lock and temporary files."""

from __future__ import annotations

from pathlib import Path

from ..errors import SiftError
from ..launch.claims import busy_buckets, clean_leftovers
from ..launch.records import read_worker_records
from .files import ShardFile, list_parts, write_manifest
from .format import MANIFEST, part_name


def shard_status(path: str | Path, finalize: bool = False) -> dict:
    """{path, num_shards, done, missing, running, manifest, workers}; finalize: write the manifest (every shard
    must be done) and clean up. workers: the records of the worker runs that profiled here (`launch.records`: rank,
    host, device, start-up and its phases, shards written, state)."""
    path = Path(path)
    parts = list_parts(path) if path.is_dir() else []
    if not parts:
        raise SiftError(f"{path}: no shard files yet")
    first = ShardFile.open(parts[0])
    n = int(first.meta.get("sift.num_shards", 0))
    names = {p.name for p in parts}
    missing = [i for i in range(n) if part_name(i) not in names]
    running = [i for i in busy_buckets(path) if i in set(missing)]
    manifest = None
    if finalize:
        if missing:
            raise SiftError(f"{path}: {len(missing)} of {n} shards are not done (first: {part_name(missing[0])}"
                            f"{f'; {len(running)} in progress' if running else ''}); finish them before --finalize")
        manifest = str(write_manifest(path))
        clean_leftovers(path)
    return {"path": str(path), "num_shards": n, "done": n - len(missing), "missing": missing, "running": running,
            "manifest": manifest or (str(path / MANIFEST) if (path / MANIFEST).is_file() else None),
            "workers": read_worker_records(path)}
