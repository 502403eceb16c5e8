"""`sift validate`: every check a reader relies on, each failure reported as one problem line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ..bits import ca_nbytes, la_nbytes, n_pages, n_tiles
from ..errors import SiftError
from .files import ShardFile, list_parts
from .format import (FORMAT_VERSION, MANIFEST, arrow_schema, decode_metadata, matching_keys, part_name, required_keys,
                     token_sha256)


def _la_problems(blob: bytes, vectors: int, pages: int) -> str | None:
    """Padding bits must be zero and diagonal tiles set."""
    lb = la_nbytes(pages)
    bits = np.unpackbits(np.frombuffer(blob, dtype=np.uint8).reshape(vectors, lb), axis=1)
    if bits[:, n_tiles(pages):].any():
        return "LA padding bits are not zero"
    diag = [r * (r + 1) // 2 + r for r in range(pages)]
    if not bits[:, diag].all():
        return "an LA diagonal tile is not set"
    return None


def validate_path(path: str | Path) -> dict:
    """Return {"ok": bool, "files": n, "documents": n, "problems": [str, ...]}."""
    path = Path(path)
    problems: list[str] = []
    if not path.exists():
        raise SiftError(f"not found: {path}")
    files = [path] if path.is_file() else list_parts(path)
    if not files:
        raise SiftError(f"{path}: no shard files (part-*.parquet)")
    expected_schema = arrow_schema()
    opened: list[ShardFile] = []
    seen: dict[str, str] = {}
    docs = 0
    for p in files:
        try:
            f = ShardFile.open(p)
            table = f.read()
        except SiftError as exc:
            problems.append(str(exc))
            continue
        opened.append(f)
        if not table.schema.remove_metadata().equals(expected_schema):
            problems.append(f"{p.name}: columns {table.schema.names} do not match schema v{FORMAT_VERSION}")
            continue
        missing = [k for k in required_keys() if k not in f.meta]
        if missing:
            problems.append(f"{p.name}: metadata keys missing: {', '.join(missing)}")
            continue
        bad = [k for k, v in f.meta.items() if isinstance(v, Exception)]
        if bad:
            problems.append(f"{p.name}: metadata not UTF-8 JSON: {', '.join(bad)}")
            continue
        if f.meta["sift.format_version"] != FORMAT_VERSION:
            problems.append(f"{p.name}: format version {f.meta['sift.format_version']} (this sift reads "
                            f"{FORMAT_VERSION})")
            continue
        if p.name.startswith("part-") and p.name != part_name(int(f.meta["sift.shard_index"])):
            problems.append(f"{p.name}: metadata says shard {f.meta['sift.shard_index']}")
        L, H, T = int(f.meta["sift.n_layers"]), int(f.meta["sift.n_heads"]), int(f.meta["sift.tile_size"])
        ids = table.column("doc_id").to_pylist()
        if ids != sorted(ids):
            problems.append(f"{p.name}: rows are not sorted by doc_id")
        for row, rec in enumerate(table.to_pylist()):
            where = f"{p.name} row {row} ({rec['doc_id']!r})"
            docs += 1
            if rec["doc_id"] in seen:
                problems.append(f"{where}: duplicate doc_id (also in {seen[rec['doc_id']]})")
            seen[rec["doc_id"]] = p.name
            problems.extend(f"{where}: {msg}" for msg in _row_problems(rec, L, H, T))

    complete = [f for f in opened if all(k in f.meta for k in required_keys())]
    if complete:
        first = complete[0]
        for f in complete[1:]:
            for key in matching_keys():
                if f.meta.get(key) != first.meta.get(key):
                    problems.append(f"{f.path.name}: {key} differs from {first.path.name}")
        if path.is_dir():
            problems.extend(_manifest_problems(path, complete, first.meta))
    return {"ok": not problems, "path": str(path), "files": len(files), "documents": docs, "problems": problems}


def _row_problems(rec: dict, L: int, H: int, T: int) -> list[str]:
    """What is wrong with one row: token count and hash, bit-vector lengths, padding and diagonal bits."""
    n = rec["n_tokens"]
    if n != len(rec["tokens"]) or n < 1:
        return [f"n_tokens {n} but {len(rec['tokens'])} token ids"]
    out = []
    if token_sha256(rec["tokens"]) != rec["token_sha256"]:
        out.append("token_sha256 does not match the token ids")
    P = n_pages(n, T)
    if len(rec["la_bits"]) != L * H * la_nbytes(P):
        out.append(f"la_bits has {len(rec['la_bits'])} bytes, expected {L * H * la_nbytes(P)} for {n} tokens at T={T}")
    else:
        msg = _la_problems(rec["la_bits"], L * H, P)
        if msg:
            out.append(msg)
    if len(rec["ca_bits"]) != L * H * ca_nbytes(P):
        out.append(f"ca_bits has {len(rec['ca_bits'])} bytes, expected {L * H * ca_nbytes(P)} for {n} tokens at T={T}")
    elif P % 8 and np.unpackbits(np.frombuffer(rec["ca_bits"], np.uint8).reshape(L * H, -1), axis=1)[:, P:].any():
        out.append("CA padding bits are not zero")
    return out


def _manifest_problems(directory: Path, files: list[ShardFile], meta: dict) -> list[str]:
    manifest = directory / MANIFEST
    num_shards = int(meta["sift.num_shards"])
    present = {f.path.name for f in files}
    missing = [part_name(i) for i in range(num_shards) if part_name(i) not in present]
    out = []
    if missing:
        out.append(f"{len(missing)} of {num_shards} shards missing (first: {missing[0]}); "
                   f"re-run `sift profile` to finish")
    expected = {part_name(i) for i in range(num_shards)} | {MANIFEST}
    for p in sorted(directory.glob("*.parquet")):
        if p.name not in expected:
            out.append(f"{p.name}: not a file of this shard set (part-00000..{part_name(num_shards - 1)} and "
                       f"{MANIFEST}); move it out of the directory")
    if not manifest.is_file():
        return out + [f"{MANIFEST} missing; run `sift status {directory} --finalize`"]
    try:
        table = pq.read_table(manifest)
    except Exception as exc:
        return out + [f"{MANIFEST}: unreadable ({str(exc).splitlines()[0]})"]
    mmeta = decode_metadata(table.schema.metadata)
    for key in matching_keys():
        if mmeta.get(key) != meta.get(key):
            out.append(f"{MANIFEST}: {key} differs from the shard files")
    out.extend(_recorded_file_problems(directory, mmeta.get("sift.files")))
    indexed = {}
    for d, fname, row in zip(table.column("doc_id").to_pylist(), table.column("file").to_pylist(),
                             table.column("row").to_pylist()):
        indexed[d] = (fname, row)
    actual = {}
    for f in files:
        for row, d in enumerate(f.read(["doc_id"]).column("doc_id").to_pylist()):
            actual[d] = (f.path.name, row)
    wrong = [d for d in actual if indexed.get(d) != actual[d]]
    extra = [d for d in indexed if d not in actual]
    if wrong:
        out.append(f"{MANIFEST}: {len(wrong)} documents not indexed at their file and row (first: {wrong[0]!r}); "
                   f"run `sift status {directory} --finalize`")
    if extra:
        out.append(f"{MANIFEST}: indexes {len(extra)} documents no shard holds (first: {extra[0]!r})")
    return out


def _recorded_file_problems(directory: Path, recorded) -> list[str]:
    """The manifest's record of each part file (`sift.files`: name, rows, bytes) against the files."""
    if not isinstance(recorded, list):
        return [f"{MANIFEST}: no record of its part files (sift.files); run `sift status {directory} --finalize`"]
    out = []
    for r in recorded:
        p = directory / str(r.get("file"))
        if not p.is_file():
            out.append(f"{MANIFEST}: records {r.get('file')}, which is not there; run `sift status {directory} "
                       f"--finalize`")
        elif p.stat().st_size != r.get("bytes"):
            out.append(f"{MANIFEST}: records {p.name} as {r.get('bytes')} bytes, the file has {p.stat().st_size}: it "
                       f"changed after the manifest was written; run `sift status {directory} --finalize` to index it "
                       f"again")
    return out
