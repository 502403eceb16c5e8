"""Building the serving store of a shard set from its part files: every bucket file that is missing or stale
(`sift index`, and `sift status --finalize` / the end of `sift profile` with the manifest), with worker processes
across files; and whether one bucket file is current."""

from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..atomic import remove_dead_temporaries
from ..errors import SiftError
from ..launch.claims import clean_leftovers
from ..locks import bucket_claims, manifest_lock
from ..shards.files import ShardFile, list_parts, shared_metadata, skipped_documents
from ..shards.names import part_index
from .layout import SUFFIX, BucketView, StoreDamage, bucket_file_name, part_fingerprint
from .writer import store_dir, write_bucket, write_set_header


def part_rows_from_table(table) -> tuple[list[str], list[bytes], list[bytes], list[bytes]]:
    """(doc ids, tokens as int32 bytes, la_bits, ca_bits) of a part file's table, read column-wise."""
    ids = table.column("doc_id").to_pylist()
    tokens = table.column("tokens").combine_chunks()
    values = tokens.values.to_numpy(zero_copy_only=False).astype("<i4", copy=False)
    offs = tokens.offsets.to_numpy()
    toks = [values[offs[i]: offs[i + 1]].tobytes() for i in range(len(ids))]
    return ids, toks, table.column("la_bits").to_pylist(), table.column("ca_bits").to_pylist()


def bucket_state(part: Path, digest: str | None = None, verify: bool = False) -> str | None:
    """Why the bucket file of `part` cannot serve (missing, damaged, built from another part file or for another
    set), or None when it is current. Reads its header, table and the part's footer; with `verify` also every
    record (their checksums)."""
    try:
        shard = part_index(part.name)
    except ValueError:
        return "not a part file"
    path = store_dir(part.parent) / bucket_file_name(shard)
    if not path.is_file():
        return "missing"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        view = BucketView(buf, path.name)
    except StoreDamage as exc:
        return f"damaged ({exc})"
    recorded = view.meta.get("part") or {}
    if {k: recorded.get(k) for k in ("bytes", "footer_sha256")} != part_fingerprint(part):
        return "stale (its part file changed after it was built)"
    if digest is not None and view.meta.get("set_digest") != digest:
        return "built for other settings (set digest differs)"
    if verify:
        try:
            view.verify()
        except StoreDamage as exc:
            return f"damaged ({exc})"
    return None


def _index_one(part: str) -> str:
    """Rebuild one bucket file holding its bucket's claim (a writer of that bucket writes its part and bucket
    files under it), so the bucket file is built from the part file in place."""
    with bucket_claims(Path(part).parent).claim(part_index(Path(part).name), wait=True):
        return _build_bucket(part)


def _build_bucket(part: str) -> str:
    if not Path(part).is_file():
        return part  # set aside meanwhile (unreadable)
    shard = ShardFile.open(Path(part))
    ids, tokens, la, ca = part_rows_from_table(shard.read(["doc_id", "tokens", "la_bits", "ca_bits"]))
    rows = [{"doc_id": d, "tokens": t, "la_bits": a, "ca_bits": c} for d, t, a, c in zip(ids, tokens, la, ca)]
    write_bucket(Path(part), rows, shard.meta)
    return part


def index_set(directory: str | Path, workers: int = 1, rebuild: bool = False, verify: bool = False,
              hold_lock: bool = True) -> dict:
    """Under the set's manifest lock (hold_lock=False: the caller holds it), see `_index_set`."""
    if not hold_lock:
        return _index_set(Path(directory), workers, rebuild, verify)
    with manifest_lock(directory):
        return _index_set(Path(directory), workers, rebuild, verify)


def _index_set(directory: Path, workers: int, rebuild: bool, verify: bool) -> dict:
    """Build every bucket file of a shard set that is missing or stale (all of them with `rebuild`; with `verify`,
    also those with a damaged record, every record's checksum read) and `store/set.json`; remove bucket files no
    part file has. Returns {built, current, removed, seconds}."""
    t0 = time.perf_counter()
    directory = Path(directory)
    parts = list_parts(directory)
    if not parts:
        raise SiftError(f"{directory}: no shard files (part-*.parquet) to index")
    files = [ShardFile.open(p) for p in parts]
    meta = shared_metadata(files)
    header = write_set_header(directory, meta)
    todo = [str(p) for p in parts if rebuild or bucket_state(p, header["digest"], verify) is not None]
    if workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(min(workers, len(todo))) as pool:
            list(pool.map(_index_one, todo, chunksize=max(1, len(todo) // (8 * workers))))
    else:
        for p in todo:
            _index_one(p)
    names = {bucket_file_name(part_index(p.name)) for p in parts}
    removed = 0
    for f in store_dir(directory).glob(f"part-*{SUFFIX}"):
        if f.name not in names:
            os.unlink(f)
            removed += 1
    clean_leftovers(directory)  # lock files and temporaries of buckets no process holds
    for d in (directory, store_dir(directory)):  # what writers killed before their rename left
        remove_dead_temporaries(d)
    skipped = skipped_documents(files)
    return {"path": str(directory), "buckets": len(parts), "built": len(todo), "current": len(parts) - len(todo),
            "removed": removed, "skipped_documents": len(skipped), "seconds": time.perf_counter() - t0}
