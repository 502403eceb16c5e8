"""Shard files on disk: the atomic writer, `ShardFile` (one part file's metadata and rows), listing a directory's
parts and the metadata they share (the manifest: `manifest.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..atomic import atomic_write  # noqa: F401 (every shard writer's)
from ..errors import SiftError
from ..store.writer import write_bucket
from .format import (PART_GLOB, arrow_schema, decode_metadata, encode_metadata, matching_keys,
                     required_keys)


def write_shard(path: Path, rows: list[dict], meta: dict) -> None:
    """rows: dicts with the schema's columns; written sorted by doc_id, ZSTD, with `sift.*` metadata."""
    rows = sorted(rows, key=lambda r: r["doc_id"])
    schema = arrow_schema()
    table = pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
    table = table.replace_schema_metadata(encode_metadata(meta))
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd", compression_level=9,
                                                  row_group_size=1024))
    write_bucket(path, rows, meta)  # the serving store's copy, for point reads (store/)


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
                            f"re-run `sift profile` to redo this shard (it sets the file aside)") from exc
        return ShardFile(path, decode_metadata(pf.schema_arrow.metadata), pf.metadata.num_rows)

    def read(self, columns: list[str] | None = None) -> pa.Table:
        try:
            return pq.read_table(self.path, columns=columns)
        except Exception as exc:
            raise SiftError(f"{self.path}: cannot read ({str(exc).splitlines()[0]}); the file is corrupt or "
                            f"truncated: re-run `sift profile` to redo it (it sets the file aside)") from exc


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
