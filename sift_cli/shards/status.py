"""`sift status`: which shards of a directory are done, in progress (held by a live worker) and missing; finalising
writes the manifest and removes leftover lock and temporary files."""

from __future__ import annotations

from pathlib import Path

from ..errors import SiftError
from ..launch.claims import busy_buckets, clean_leftovers
from ..launch.records import read_worker_records
from .files import ShardFile, list_parts, shared_metadata
from .manifest import write_manifest
from .format import MANIFEST, part_name, required_keys
from .names import part_index


def shard_status(path: str | Path, finalize: bool = False) -> dict:
    """{path, num_shards, done, missing, running, manifest, workers}; finalize: write the manifest (every shard
    must be done) and clean up. workers: the records of the worker runs that profiled here (`launch.records`: rank, host,
    device, start-up and its phases, shards written, state)."""
    path = Path(path)
    parts = list_parts(path) if path.is_dir() else []
    if not parts:
        raise SiftError(f"{path}: no shard files yet — run `sift profile CORPUS --out {path}` first")
    missing, bad, n = done_shards(parts)
    running = [i for i in busy_buckets(path) if i in set(missing)]
    manifest = None
    if finalize:
        if missing:
            raise SiftError(f"{path}: {len(missing)} of {n} shards are not done (first: {part_name(missing[0])}"
                            f"{f'; {len(running)} in progress' if running else ''}"
                            f"{f'; {len(bad)} unreadable or incomplete' if bad else ''}) — re-run `sift profile` "
                            f"with the same arguments to finish them, then --finalize",
                            [f"{b['file']}: {b['problem']}" for b in bad])
        manifest = str(write_manifest(path))
        clean_leftovers(path)
    return {"path": str(path), "num_shards": n, "done": n - len(missing), "missing": missing, "bad": bad,
            "running": running,
            "manifest": manifest or (str(path / MANIFEST) if (path / MANIFEST).is_file() else None),
            "workers": read_worker_records(path)}


def done_shards(parts: list[Path]) -> tuple[list[int], list[dict], int]:
    """(missing shard indices, bad files [{shard, file, problem}], num_shards) of a directory's part files.

    A shard is done when its file is there, readable (footer and doc ids) and complete (the set's metadata, the
    bucket its name says); a file that is not (truncated, say) is listed as bad with its problem and its shard
    counts as missing. Part files of different settings in one directory are refused, as by every command that
    opens a shard set."""
    files, bad = [], {}
    for p in parts:
        problem, f = _shard_problem(p)
        if problem:
            bad[p.name] = problem
        else:
            files.append(f)
    if not files:
        raise SiftError(f"{parts[0].parent}: none of its {len(parts)} shard files is readable — re-run `sift "
                        f"profile` with the same arguments to redo them",
                        [f"{name}: {problem}" for name, problem in bad.items()])
    shared_metadata(files)
    n = int(files[0].meta["sift.num_shards"])
    done = set()
    for f in files:
        if f.path.name == part_name(int(f.meta["sift.shard_index"])):
            done.add(f.path.name)
        else:
            bad[f.path.name] = f"its metadata says shard {f.meta['sift.shard_index']}"
    missing = [i for i in range(n) if part_name(i) not in done]
    return missing, [{"shard": _index_of(name), "file": name, "problem": problem}
                     for name, problem in sorted(bad.items())], n


def _shard_problem(path: Path) -> tuple[str | None, ShardFile | None]:
    """(None, the file) when a part file is readable and complete, else (what is wrong, None)."""
    try:
        f = ShardFile.open(path)
    except SiftError:
        return "not a readable Parquet file (truncated or corrupt)", None
    missing = [k for k in required_keys() if k not in f.meta]
    if missing:
        return f"metadata keys missing: {', '.join(missing)}", None
    try:
        ids = f.read(["doc_id"]).column("doc_id")
    except SiftError:
        return "its rows cannot be read (truncated or corrupt)", None
    if len(ids) != f.num_rows:
        return f"{len(ids)} of its {f.num_rows} rows can be read", None
    return None, f


def _index_of(name: str) -> int | None:
    try:
        return part_index(name)
    except ValueError:
        return None
