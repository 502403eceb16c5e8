"""Shard files on disk: the atomic writer, `ShardFile` (one part file's metadata and rows), listing a directory's
parts, the metadata they share, and the manifest (`manifest.parquet`, doc_id → file, row).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import SiftError
from .format import (MANIFEST, PART_GLOB, arrow_schema, decode_metadata, encode_metadata, manifest_schema,
                     matching_keys, required_keys)


def _new_temporary(path: Path) -> str:
    """Create an empty temporary file beside `path` (`.NAME.RANDOM.tmp`), its mode 0666 less the umask as for any
    ordinary file (tempfile.mkstemp would make it 0600, unreadable to the other users of a shared cluster)."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write(path: Path, write) -> None:
    """Run write(tmp_path), then rename into place: a crash never leaves a readable half file at `path`. The file's
    mode follows the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temporary(path)
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
    """Metadata every file agrees on; raise naming the first file that differs from the first one. Every command
    that opens a shard set applies this check (`sift inspect`, `validate`, `status`, `ids`, `prefill`, the
    evaluations), so shard files of different settings mixed in one directory are refused alike."""
    first = files[0]
    for key in required_keys():
        if key not in first.meta:
            raise SiftError(f"{first.path}: metadata key {key} missing (not a sift shard, or an old format) — "
                            f"re-run `sift profile` into a new directory")
    for f in files[1:]:
        for key in matching_keys():
            if f.meta.get(key) != first.meta.get(key):
                raise SiftError(mixed_sets_message(f.path, first.path, key, f.meta.get(key), first.meta.get(key)))
    return {k: v for k, v in first.meta.items() if k not in ("sift.shard_index", "sift.skipped",
                                                             "sift.skip_reasons")}


def mixed_sets_message(path: Path, first: Path, key: str, value, first_value) -> str:
    shown = (f" ({_short(value)} vs {_short(first_value)})" if key not in ("sift.model", "sift.tokenizer",
                                                                           "sift.prefix_token_ids") else "")
    return (f"{path}: {key.removeprefix('sift.')} differs from {first.name}'s{shown}: shards of a different model or "
            f"settings are mixed in one directory — keep one shard set per directory (move the other files out)")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def skipped_documents(files: list[ShardFile]) -> dict[str, str]:
    """doc_id → why it was not profiled, over every file of a set (files written before reasons were recorded
    give "skipped at profile time")."""
    out: dict[str, str] = {}
    for f in files:
        reasons = f.meta.get("sift.skip_reasons")
        reasons = reasons if isinstance(reasons, dict) else {}
        for d in f.meta.get("sift.skipped") or []:
            out[d] = reasons.get(d, "skipped at profile time")
    return dict(sorted(out.items()))


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
    skipped = skipped_documents(files)  # every bucket's, so that readers of the manifest can say why an id is absent
    meta["sift.skipped"], meta["sift.skip_reasons"] = list(skipped), skipped
    table = table.replace_schema_metadata(encode_metadata(meta))
    path = directory / MANIFEST
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path
