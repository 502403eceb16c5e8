"""Shard files on disk: the atomic writer, `ShardFile` (one part file's metadata and rows), listing a directory's
parts, the metadata they share, and the manifest (`manifest.parquet`, doc_id → file, row).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import SiftError
from .format import (MANIFEST, PART_GLOB, arrow_schema, decode_metadata, encode_metadata, manifest_schema,
                     matching_keys, required_keys)


def atomic_write(path: Path, write) -> None:
    """Run write(tmp_path), then rename into place: a crash never leaves a readable half file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_shard(path: Path, rows: list[dict], meta: dict) -> None:
    """rows: dicts with the schema's columns; written sorted by doc_id, ZSTD, with `sift.*` metadata."""
    rows = sorted(rows, key=lambda r: r["doc_id"])
    schema = arrow_schema()
    table = pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
    table = table.replace_schema_metadata(encode_metadata(meta))
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd", compression_level=9,
                                                  row_group_size=1024))


@dataclass
class ShardFile:
    path: Path
    meta: dict
    num_rows: int

    @staticmethod
    def open(path: Path) -> "ShardFile":
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:
            raise SiftError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]}); "
                            f"delete it and re-run `sift profile` to redo this shard") from exc
        return ShardFile(path, decode_metadata(pf.schema_arrow.metadata), pf.metadata.num_rows)

    def read(self, columns: list[str] | None = None) -> pa.Table:
        try:
            return pq.read_table(self.path, columns=columns)
        except Exception as exc:
            raise SiftError(f"{self.path}: cannot read ({str(exc).splitlines()[0]}); the file is corrupt or "
                            f"truncated: delete it and re-run `sift profile`") from exc


def list_parts(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob(PART_GLOB) if p.is_file())


def shard_paths(path: Path) -> list[Path]:
    """A shard file, or every part file of a directory."""
    if not path.exists():
        raise SiftError(f"not found: {path}")
    if path.is_file():
        return [path]
    parts = list_parts(path)
    if not parts:
        raise SiftError(f"{path}: no shard files (part-*.parquet); run `sift profile CORPUS --out {path}` first")
    return parts


def shared_metadata(files: list[ShardFile]) -> dict:
    """Metadata every file agrees on; raise naming the first file that differs from the first one."""
    first = files[0]
    for key in required_keys():
        if key not in first.meta:
            raise SiftError(f"{first.path}: metadata key {key} missing (not a sift shard, or an old format)")
    for f in files[1:]:
        for key in matching_keys():
            if f.meta.get(key) != first.meta.get(key):
                raise SiftError(f"{f.path}: {key} differs from {first.path.name} (shards of a different model or "
                                f"settings are mixed in one directory; keep one shard set per directory)")
    return {k: v for k, v in first.meta.items() if k not in ("sift.shard_index",)}


def write_manifest(directory: Path) -> Path:
    """Index doc_id → (file, row) over every part file, sorted by doc_id; written atomically."""
    files = [ShardFile.open(p) for p in list_parts(directory)]
    if not files:
        raise SiftError(f"{directory}: no shard files to index")
    meta = shared_metadata(files)
    ids, names, rows, lengths = [], [], [], []
    for f in files:
        t = f.read(["doc_id", "n_tokens"])
        n = t.num_rows
        ids.extend(t.column("doc_id").to_pylist())
        names.extend([f.path.name] * n)
        rows.extend(range(n))
        lengths.extend(t.column("n_tokens").to_pylist())
    order = sorted(range(len(ids)), key=ids.__getitem__)
    table = pa.table({"doc_id": [ids[i] for i in order], "file": [names[i] for i in order],
                      "row": [rows[i] for i in order], "n_tokens": [lengths[i] for i in order]},
                     schema=manifest_schema())
    meta["sift.files"] = [{"file": f.path.name, "rows": f.num_rows, "bytes": f.path.stat().st_size} for f in files]
    table = table.replace_schema_metadata(encode_metadata(meta))
    path = directory / MANIFEST
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path
