"""Writing the serving store beside a shard set: a bucket file from the rows of its part file (every writer of a
part file writes it next: `shards.files.write_shard`) and `store/set.json` from the set's shared metadata."""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import atomic_write
from ..shards.format import matching_keys
from .layout import SET_FILE, STORE_DIR, VERSION, bucket_file_name, encode_bucket, part_fingerprint, set_digest

SET_FORMAT = "sift serving store"


def store_dir(directory: Path) -> Path:
    return Path(directory) / STORE_DIR


def shared_set_metadata(meta: dict) -> dict:
    """The keys every part file of a set shares (`schemas/`: must_match_across_files), as the store records them."""
    return {k: meta[k] for k in matching_keys() if k in meta}


def write_set_header(directory: Path, meta: dict) -> dict:
    """`store/set.json` for a set whose part files carry `meta`; rewritten only when it differs. Returns it."""
    shared = shared_set_metadata(meta)
    header = {"format": SET_FORMAT, "version": VERSION, "num_shards": int(shared["sift.num_shards"]),
              "digest": set_digest(shared), "meta": shared}
    path = store_dir(directory) / SET_FILE
    if read_set_header(path) != header:
        text = json.dumps(header, sort_keys=True, indent=1) + "\n"
        atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return header


def read_set_header(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def bucket_meta(part: Path, meta: dict, digest: str) -> dict:
    """What a bucket file records besides its documents: its bucket, the set's digest, the fingerprint of the part
    file it is built from (already in place) and the documents skipped at profile time, with their reasons."""
    skipped = meta.get("sift.skip_reasons") or {d: "skipped at profile time" for d in meta.get("sift.skipped") or []}
    return {"shard_index": int(meta["sift.shard_index"]), "set_digest": digest,
            "part": {"name": part.name, **part_fingerprint(part)}, "skipped": dict(sorted(skipped.items()))}


def write_bucket(part: Path, rows: list[dict], meta: dict) -> Path:
    """The bucket file of part file `part` (already in place), from the rows and metadata it was written with;
    atomic. rows: dicts with doc_id, tokens, la_bits, ca_bits."""
    header = write_set_header(part.parent, meta)
    data = encode_bucket([r["doc_id"] for r in rows], [r["tokens"] for r in rows], [r["la_bits"] for r in rows],
                         [r["ca_bits"] for r in rows], bucket_meta(part, meta, header["digest"]))
    path = store_dir(part.parent) / bucket_file_name(int(meta["sift.shard_index"]))
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
    return path
