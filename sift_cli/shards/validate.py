"""`sift validate`: every check a reader relies on, each failure one problem (code, file, doc_id, row, message).

Files are checked column-wise (`row_checks`), several at once with `workers` processes; a part file's serving-store
bucket is compared byte for byte with what its rows make (`store.layout.encode_bucket`), so a damaged or stale
store is reported, never trusted. Memory stays bounded by a few files and the ids (one Arrow array per file, for
the manifest)."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..cpu_memory import keep_freed_memory
from ..errors import SiftError
from ..store.index import bucket_state, part_rows_from_table
from ..store.layout import SET_FILE, STORE_DIR, SUFFIX, bucket_file_name, encode_bucket
from ..store.writer import bucket_meta, read_set_header, shared_set_metadata
from .files import ShardFile, list_parts
from .format import FORMAT_VERSION, MANIFEST, arrow_schema, decode_metadata, matching_keys, part_name, required_keys
from .names import doc_key, part_index
from .row_checks import RowChecks, problem
from .recovery import advice


@dataclass
class FileResult:
    name: str
    problems: list = field(default_factory=list)
    meta: dict | None = None  # when complete (required keys, this format)
    documents: int = 0
    ids: pa.Array | None = None
    misplaced: list = field(default_factory=list)  # ids in a bucket they do not hash to


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def check_file(path: str, with_store: bool) -> FileResult:
    """Every check of one part file (and, with_store, of its serving-store bucket)."""
    keep_freed_memory()  # each file's buffers reuse the last one's pages instead of faulting fresh ones
    p = Path(path)
    res = FileResult(p.name)
    try:
        f = ShardFile.open(p)
        table = f.read()
    except SiftError as exc:
        res.problems.append(problem("unreadable", str(exc), p.name))
        return res
    if not table.schema.remove_metadata().equals(arrow_schema()):
        res.problems.append(problem("schema", f"{p.name}: columns {table.schema.names} do not match schema "
                                              f"v{FORMAT_VERSION}", p.name))
        return res
    missing = [k for k in required_keys() if k not in f.meta]
    if missing:
        res.problems.append(problem("metadata-missing", f"{p.name}: metadata keys missing: {', '.join(missing)}",
                                    p.name))
        return res
    bad = [k for k, v in f.meta.items() if isinstance(v, Exception)]
    if bad:
        res.problems.append(problem("metadata-encoding", f"{p.name}: metadata not UTF-8 JSON: {', '.join(bad)}",
                                    p.name))
        return res
    if f.meta["sift.format_version"] != FORMAT_VERSION:
        res.problems.append(problem("format-version", f"{p.name}: format version {f.meta['sift.format_version']} "
                                                      f"(this sift reads {FORMAT_VERSION})", p.name))
        return res
    res.meta = f.meta
    shard = int(f.meta["sift.shard_index"])
    if p.name.startswith("part-") and p.name != part_name(shard):
        res.problems.append(problem("shard-index", f"{p.name}: metadata says shard {shard}", p.name))
    checks = RowChecks(p.name, table, int(f.meta["sift.n_layers"]), int(f.meta["sift.n_heads"]),
                       int(f.meta["sift.tile_size"]), shard, int(f.meta["sift.num_shards"]))
    res.problems.extend(checks.problems)
    res.documents, res.ids, res.misplaced = checks.n, checks.ids, checks.misplaced
    if with_store:
        res.problems.extend(_store_problems(p, table, f.meta, checks.keys))
    return res


def _store_problems(part: Path, table: pa.Table, meta: dict, keys: list[int]) -> list[dict]:
    """The part's bucket file against what its rows and metadata make, byte for byte."""
    shard = int(meta["sift.shard_index"])
    path = part.parent / STORE_DIR / bucket_file_name(shard)
    where = f"{STORE_DIR}/{path.name}"
    state = bucket_state(part)
    if state is not None:
        fix = "--verify" if state.startswith("damaged") else ""
        return [problem(f"store-{state.split()[0]}", f"{where}: {state}; rebuild it with `sift index "
                                                     f"{part.parent}{' ' + fix if fix else ''}`", where)]
    header = read_set_header(part.parent / STORE_DIR / SET_FILE)
    expected = encode_bucket(*part_rows_from_table(table), bucket_meta(part, meta, header["digest"]), keys)
    if path.read_bytes() != expected:
        return [problem("store-content", f"{where}: does not hold what {part.name} holds; rebuild it with "
                                         f"`sift index {part.parent} --rebuild`", where)]
    return []


def validate_path(path: str | Path, workers: int | None = None) -> dict:
    """{"ok", "path", "files", "documents", "problems": [{code, file, doc_id, row, message}, ...]}."""
    path = Path(path)
    if not path.exists():
        raise SiftError(f"not found: {path}")
    files = [path] if path.is_file() else list_parts(path)
    if not files:
        raise SiftError(f"{path}: no shard files (part-*.parquet)")
    header = read_set_header(path / STORE_DIR / SET_FILE) if path.is_dir() else None
    with_store = header is not None
    workers = workers or default_workers()
    if workers > 1 and len(files) > 1:
        with ProcessPoolExecutor(min(workers, len(files))) as pool:
            results = list(pool.map(check_file, [str(f) for f in files], [with_store] * len(files), chunksize=4))
    else:
        results = [check_file(str(f), with_store) for f in files]
    problems = [q for r in results for q in r.problems]
    complete = [r for r in results if r.meta is not None]
    problems.extend(_duplicates(complete))
    if complete:
        first = complete[0]
        for r in complete[1:]:
            for key in matching_keys():
                if r.meta.get(key) != first.meta.get(key):
                    problems.append(problem("metadata-differs", f"{r.name}: {key} differs from {first.name}", r.name))
        if path.is_dir():
            problems.extend(_folder_problems(path, complete, first.meta, header))
    return {"ok": not problems, "path": str(path), "files": len(files), "documents": sum(r.documents for r in results),
            "problems": problems}


def _duplicates(results: list[FileResult]) -> list[dict]:
    """Ids found outside their bucket that their own bucket's file holds too."""
    by_shard = {int(r.meta["sift.shard_index"]): r for r in results}
    out = []
    for r in results:
        n = int(r.meta["sift.num_shards"])
        for d in r.misplaced:
            home = by_shard.get(doc_key(d) % n)
            if home is not None and home.ids is not None and d in set(home.ids.to_pylist()):
                out.append(problem("duplicate-id", f"{r.name} ({d!r}): duplicate doc_id (also in {home.name})",
                                   r.name, d))
    return out


def _folder_problems(directory: Path, results: list[FileResult], meta: dict, header: dict | None) -> list[dict]:
    """Shards missing, files that are not the set's, the manifest, the store's set header and stray bucket files."""
    num_shards = int(meta["sift.num_shards"])
    present = {r.name for r in results}
    missing = [part_name(i) for i in range(num_shards) if part_name(i) not in present]
    out = []
    if missing:
        out.append(problem("shards-missing", f"{len(missing)} of {num_shards} shards missing (first: {missing[0]}); "
                                             + advice("interrupted-run", directory)))
    expected = {part_name(i) for i in range(num_shards)} | {MANIFEST}
    for p in sorted(directory.glob("*.parquet")):
        if p.name not in expected:
            out.append(problem("foreign-file", f"{p.name}: not a file of this shard set (part-00000.."
                                               f"{part_name(num_shards - 1)} and {MANIFEST}); "
                                               + advice("foreign-file", directory, p.name), p.name))
    if header is not None:
        shared = shared_set_metadata(meta)
        if header.get("meta") != shared:
            out.append(problem("store-header", f"{STORE_DIR}/{SET_FILE}: describes other settings than the part "
                                               f"files; rebuild the store with `sift index {directory} --rebuild`"))
        names = {bucket_file_name(part_index(n)) for n in present if n.startswith("part-")}
        for f in sorted((directory / STORE_DIR).glob(f"part-*{SUFFIX}")):
            if f.name not in names:
                out.append(problem("store-foreign", f"{STORE_DIR}/{f.name}: no part file of the set has this "
                                                    f"bucket; `sift index {directory}` removes it"))
    return out + _manifest_problems(directory, results, meta)


def _manifest_problems(directory: Path, results: list[FileResult], meta: dict) -> list[dict]:
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return [problem("manifest-missing", f"{MANIFEST} missing; " + advice("manifest-missing", directory))]
    try:
        table = pq.read_table(manifest)
    except Exception as exc:
        return [problem("manifest-unreadable", f"{MANIFEST}: unreadable ({str(exc).splitlines()[0]})", MANIFEST)]
    out = []
    mmeta = decode_metadata(table.schema.metadata)
    for key in matching_keys():
        if mmeta.get(key) != meta.get(key):
            out.append(problem("manifest-metadata", f"{MANIFEST}: {key} differs from the shard files", MANIFEST))
    out.extend(_recorded_file_problems(directory, mmeta.get("sift.files")))
    # the manifest's rows grouped by file and put in row order must be each file's ids
    files = table.column("file").combine_chunks().dictionary_encode()
    codes = files.indices.to_numpy(zero_copy_only=False)
    rows = table.column("row").to_numpy()
    order = np.lexsort((rows, codes))
    ids, rows = table.column("doc_id").take(pa.array(order)), rows[order]
    bounds = np.searchsorted(codes[order], np.arange(len(files.dictionary) + 1))
    indexed = {name: (ids.slice(bounds[k], bounds[k + 1] - bounds[k]), rows[bounds[k]:bounds[k + 1]])
               for k, name in enumerate(files.dictionary.to_pylist())}
    wrong, extra = [], 0
    for r in results:
        got, got_rows = indexed.pop(r.name, (pa.chunked_array([], pa.string()), np.zeros(0, np.int64)))
        actual = r.ids if r.ids is not None else pa.array([], pa.string())
        if len(got) != len(actual) or not np.array_equal(got_rows, np.arange(len(actual))) or \
                not got.combine_chunks().equals(actual):
            first = next((a for a, b in zip(actual.to_pylist(), got.to_pylist() + [None] * len(actual)) if a != b),
                         None)
            wrong.append((r.name, first))
    for name, (got, _) in indexed.items():
        extra += len(got)
    if wrong:
        out.append(problem("manifest-rows", f"{MANIFEST}: the documents of {len(wrong)} files are not indexed at their "
                                            f"file and row (first: {wrong[0][0]}, {wrong[0][1]!r}); run `sift status "
                                            f"{directory} --finalize`", MANIFEST, wrong[0][1]))
    if extra:
        out.append(problem("manifest-extra", f"{MANIFEST}: indexes {extra} documents no shard holds", MANIFEST))
    return out


def _recorded_file_problems(directory: Path, recorded) -> list[dict]:
    """The manifest's record of each part file (`sift.files`: name, rows, bytes) against the files."""
    if not isinstance(recorded, list):
        return [problem("manifest-files", f"{MANIFEST}: no record of its part files (sift.files); run `sift status "
                                          f"{directory} --finalize`", MANIFEST)]
    out = []
    for r in recorded:
        p = directory / str(r.get("file"))
        if not p.is_file():
            out.append(problem("manifest-files", f"{MANIFEST}: records {r.get('file')}, which is not there; run "
                                                 f"`sift status {directory} --finalize`", MANIFEST))
        elif p.stat().st_size != r.get("bytes"):
            out.append(problem("manifest-files", f"{MANIFEST}: records {p.name} as {r.get('bytes')} bytes, the file has "
                                                 f"{p.stat().st_size}: it changed after the manifest was written; run "
                                                 f"`sift status {directory} --finalize` to index it again", MANIFEST))
    return out
