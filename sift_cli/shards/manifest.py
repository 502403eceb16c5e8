"""A finished shard set's indexes: `manifest.parquet` (doc_id → file, row, for any Parquet reader) and the serving
store's files (`store/`), both written when every bucket exists (the end of `sift profile`, `sift status
--finalize`, each addition)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import SiftError
from ..locks import manifest_lock
from ..store.index import index_set
from .files import ShardFile, atomic_write, list_parts, shared_metadata, skipped_documents
from .format import MANIFEST, encode_metadata, manifest_schema


def write_manifest(directory: Path) -> Path:
    """Index doc_id → (file, row) over every part file, sorted by doc_id, and the serving store's stale files;
    written atomically under the set's manifest lock (`locks.manifest_lock`), so concurrent writers (the end of
    `sift profile`, `--finalize`, additions) take turns and the last manifest written is complete."""
    directory = Path(directory)
    with manifest_lock(directory):
        return _write_manifest(directory)


def _write_manifest(directory: Path) -> Path:
    files = [ShardFile.open(p) for p in list_parts(directory)]
    if not files:
        raise SiftError(f"{directory}: no shard files to index")
    meta = shared_metadata(files)
    parts = []
    for f in files:  # Arrow columns throughout: no Python object per document
        t = f.read(["doc_id", "n_tokens"])
        n = t.num_rows
        parts.append(pa.table({"doc_id": t.column("doc_id"), "file": pa.repeat(f.path.name, n),
                               "row": pa.array(np.arange(n, dtype=np.int32)), "n_tokens": t.column("n_tokens")},
                              schema=manifest_schema()))
    table = pa.concat_tables(parts).combine_chunks()
    table = table.take(pc.sort_indices(table, [("doc_id", "ascending")]))
    meta["sift.files"] = [{"file": f.path.name, "rows": f.num_rows, "bytes": f.path.stat().st_size} for f in files]
    skipped = skipped_documents(files)  # every bucket's, so that readers of the manifest can say why an id is absent
    meta["sift.skipped"], meta["sift.skip_reasons"] = list(skipped), skipped
    table = table.replace_schema_metadata(encode_metadata(meta))
    path = directory / MANIFEST
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    index_set(directory, hold_lock=False)  # the store's missing or stale bucket files; the lock is held
    return path
