"""A bucket whose part file cannot be read when `sift profile` comes to redo it: the file is set aside (renamed
`part-NNNNN.parquet.unreadable`, never overwritten or deleted: the user decides what becomes of it) and the
documents it held that the corpus does not have (added one prompt at a time, `profile/additions.py`) are
recovered from the serving store's copy of the bucket (`store/part-NNNNN.sbits` keeps every document's tokens),
to be profiled again with the bucket, so re-profiling never loses them."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from ..atomic import fsync_directory
from ..shards.names import part_index
from ..store.layout import BucketView, StoreDamage, bucket_file_name
from ..store.writer import store_dir

ASIDE_SUFFIX = ".unreadable"


@dataclass(frozen=True)
class StoredDocument:
    """A document known only by its id and tokens (what the store keeps), profiled like any other."""
    doc_id: str
    origin: str


def set_aside(path: Path) -> Path:
    """Rename an unreadable part file out of the set's way (`NAME.unreadable`, then `.unreadable.1`, ...)."""
    aside = path.with_name(path.name + ASIDE_SUFFIX)
    n = 0
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}{ASIDE_SUFFIX}.{n}")
    os.rename(path, aside)
    fsync_directory(path.parent)
    return aside


def stored_documents(part: Path) -> list[tuple[str, list[int]]] | None:
    """(doc_id, tokens) of every document the store's bucket file of `part` holds; None when there is none that
    can be read."""
    path = store_dir(part.parent) / bucket_file_name(part_index(part.name))
    try:
        with open(path, "rb") as f:
            if not os.fstat(f.fileno()).st_size:
                return None
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = BucketView(buf, path.name)
        return [(r.doc_id, r.token_list()) for r in view.records()]
    except (OSError, StoreDamage, ValueError):
        return None


def recover_bucket(part: Path, corpus_ids: set[str]) -> dict:
    """Set an unreadable part file aside and find its documents outside the corpus in the store. Returns {file,
    aside, documents (how many the bucket held, None when the store has no copy), recovered: [(StoredDocument,
    tokens)]}."""
    stored = stored_documents(part)
    aside = set_aside(part)
    recovered = [(StoredDocument(d, f"{aside.name} (from the store)"), t)
                 for d, t in (stored or []) if d not in corpus_ids]
    return {"file": part.name, "aside": aside.name, "documents": None if stored is None else len(stored),
            "recovered": recovered}
