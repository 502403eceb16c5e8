"""Shard files (SPEC §5): schema, atomic writer, reader, manifest.

A shard set is a directory of `part-NNNNN.parquet` files, one per hash bucket of doc_ids, plus
`manifest.parquet` (doc_id → file, row) that lets a reader find a document without opening every file. The
writer and the reader both take the Arrow schema from `schemas/shard-v1.json`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import SiftError
from .resources import resource_path

FORMAT_VERSION = 1
SCHEMA_FILE = "shard-v1.json"
MANIFEST = "manifest.parquet"
PART_GLOB = "part-*.parquet"
_TYPES = {"string": pa.string(), "binary": pa.binary(), "int32": pa.int32(), "float32": pa.float32(),
          "list<int32>": pa.list_(pa.int32())}


@functools.lru_cache(maxsize=None)
def schema_spec() -> dict:
    return json.loads(resource_path("schemas", SCHEMA_FILE).read_text())


def arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(c["name"], _TYPES[c["type"]], nullable=False) for c in schema_spec()["columns"]])


def manifest_schema() -> pa.Schema:
    return pa.schema([pa.field(c["name"], _TYPES[c["type"]], nullable=False)
                      for c in schema_spec()["manifest"]["columns"]])


def required_keys() -> list[str]:
    return schema_spec()["metadata"]["required"]


def matching_keys() -> list[str]:
    return schema_spec()["metadata"]["must_match_across_files"]


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def shard_of(doc_id: str, num_shards: int) -> int:
    """Deterministic bucket of a doc_id: independent of worker count, order and machine."""
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") % num_shards


def token_sha256(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def encode_metadata(meta: dict) -> dict[bytes, bytes]:
    return {k.encode(): json.dumps(v, sort_keys=True).encode("utf-8") for k, v in meta.items()}


def decode_metadata(raw: dict | None) -> dict:
    out = {}
    for k, v in (raw or {}).items():
        key = k.decode("utf-8", "replace")
        if key.startswith("sift."):
            try:
                out[key] = json.loads(v.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                out[key] = ValueError(f"{key} is not UTF-8 JSON")
    return out


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


@dataclass
class DocRecord:
    doc_id: str
    tokens: list[int]
    la_bits: bytes
    ca_bits: bytes


class ShardSet:
    """Read side of a shard directory: metadata and documents by id through the manifest."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise SiftError(f"shard directory not found: {directory}")
        manifest = self.dir / MANIFEST
        if not manifest.is_file():
            raise SiftError(f"{self.dir}: no {MANIFEST}; run `sift profile` to completion (or `sift status "
                            f"{self.dir} --finalize`) first")
        try:
            table = pq.read_table(manifest)
        except Exception as exc:
            raise SiftError(f"{manifest}: unreadable ({str(exc).splitlines()[0]})") from exc
        self.meta = decode_metadata(table.schema.metadata)
        missing = [k for k in matching_keys() if k not in self.meta]
        if missing:
            raise SiftError(f"{manifest}: metadata key {missing[0]} missing; re-run `sift status --finalize`")
        self._index = {d: (f, r) for d, f, r in zip(table.column("doc_id").to_pylist(),
                                                    table.column("file").to_pylist(),
                                                    table.column("row").to_pylist())}

    @property
    def tile(self) -> int:
        return int(self.meta["sift.tile_size"])

    @property
    def prefix_token_ids(self) -> list[int]:
        return list(self.meta["sift.prefix_token_ids"])

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._index

    def __len__(self) -> int:
        return len(self._index)

    def doc_ids(self) -> list[str]:
        return list(self._index)

    def get(self, doc_ids: list[str]) -> list[DocRecord]:
        missing = [d for d in doc_ids if d not in self._index]
        if missing:
            raise SiftError(f"doc_id {missing[0]!r} is not in the shard set {self.dir}"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        by_file: dict[str, list[int]] = {}
        for d in doc_ids:
            f, r = self._index[d]
            by_file.setdefault(f, []).append(r)
        found: dict[str, DocRecord] = {}
        for fname, rows in by_file.items():
            shard = ShardFile.open(self.dir / fname)
            table = shard.read(["doc_id", "tokens", "la_bits", "ca_bits"]).take(sorted(set(rows)))
            for rec in table.to_pylist():
                found[rec["doc_id"]] = DocRecord(rec["doc_id"], rec["tokens"], rec["la_bits"], rec["ca_bits"])
        for d in doc_ids:
            if d not in found:
                raise SiftError(f"{self.dir}: manifest points {d!r} at a row that holds another document; "
                                f"run `sift validate {self.dir}`")
        return [found[d] for d in doc_ids]
