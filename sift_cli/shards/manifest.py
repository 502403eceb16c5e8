"""A finished shard set's indexes: `manifest.parquet` (doc_id → file, row, for any Parquet reader) and the serving
store's files (`store/`), both written when every bucket exists (the end of `sift profile`, `sift status
--finalize`, each addition)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import SiftError
from ..store.index import index_set
from .files import ShardFile, atomic_write, list_parts, shared_metadata, skipped_documents
from .format import MANIFEST, encode_metadata, manifest_schema


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
    index_set(directory)  # the serving store: its bucket files that are missing or stale, built from the parts
    return path
