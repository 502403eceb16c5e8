"""`sift ids`: every doc_id of a shard file or directory with its status — profiled (its file and token count) or
skipped when the set was profiled (and why: longer than the model's context, an empty document...).

`DocIdListing` reads the part files (no manifest needed, so an unfinished set can be listed too) and yields the
entries in doc_id order, merging the files' sorted id columns: memory holds the ids as Arrow arrays, never one
Python object per document at once. `id_status` says, for the ids a caller names, which the set holds (a point
read where the set has a serving store), which were skipped and which it never saw; `prompt_ids_report` sums that
up for the ids of a prompt (`sift ids --docs`, `sift status --docs`).
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Iterator

from ..store.bitstore import BitStore
from ..store.layout import SET_FILE, STORE_DIR
from .files import ShardFile, shard_paths, shared_metadata, skipped_documents
from .names import part_name, shard_of

PROFILED, SKIPPED, ABSENT = "profiled", "skipped", "absent"


class DocIdListing:
    """The entries of a shard file or directory, {doc_id, status, file, n_tokens} or {doc_id, status, reason},
    iterated in doc_id order; `files`, `profiled` and `skipped` are known once opened (footers only). The files
    must make one shard set (as for every command that opens one)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._files = [ShardFile.open(p) for p in shard_paths(Path(path))]
        shared_metadata(self._files)
        self.files = len(self._files)
        self.profiled = sum(f.num_rows for f in self._files)
        self.skipped_reasons = skipped_documents(self._files)
        self.skipped = len(self.skipped_reasons)

    def _profiled(self, f: ShardFile) -> Iterator[tuple[str, int, str, int]]:
        t = f.read(["doc_id", "n_tokens"])
        ids, lengths = t.column("doc_id").combine_chunks(), t.column("n_tokens").combine_chunks()
        for i in range(0, len(ids), 4096):  # Python objects a slice at a time
            for d, n in zip(ids.slice(i, 4096).to_pylist(), lengths.slice(i, 4096).to_pylist()):
                yield d, 0, f.path.name, n

    def __iter__(self) -> Iterator[dict]:
        skipped = ((d, 1, reason, 0) for d, reason in self.skipped_reasons.items())
        for d, kind, where, n in heapq.merge(*(self._profiled(f) for f in self._files), skipped):
            yield ({"doc_id": d, "status": PROFILED, "file": where, "n_tokens": n} if kind == 0
                   else {"doc_id": d, "status": SKIPPED, "reason": where})

    def summary(self) -> dict:
        return {"path": self.path, "files": self.files, "profiled": self.profiled, "skipped": self.skipped}


def doc_id_listing(path: str | Path) -> dict:
    """{path, files, profiled, skipped, documents: [...]}, documents sorted by doc_id (all in memory: for small
    sets and tests; `DocIdListing` streams)."""
    listing = DocIdListing(path)
    return {**listing.summary(), "documents": list(listing)}


def id_status(path: str | Path, doc_ids: list[str]) -> list[dict]:
    """The entry of each of `doc_ids`, in order; ids the set never saw are `absent`. Point reads through the
    serving store where the set has one, else a pass over the listing keeping only the named ids."""
    wanted = set(doc_ids)
    if Path(path).is_dir() and (Path(path) / STORE_DIR / SET_FILE).is_file():
        store = BitStore(path)
        found = {}
        for d in wanted:
            rec = store.record(d)
            if rec is not None:
                found[d] = {"doc_id": d, "status": PROFILED, "n_tokens": len(rec.tokens) // 4,
                            "file": part_name(shard_of(d, store.num_shards))}
            elif store.skip_reason(d) is not None:
                found[d] = {"doc_id": d, "status": SKIPPED, "reason": store.skip_reason(d)}
    else:
        found = {e["doc_id"]: e for e in DocIdListing(path) if e["doc_id"] in wanted}
    return [found.get(d, {"doc_id": d, "status": ABSENT}) for d in doc_ids]


def prompt_ids_report(path: str | Path, doc_ids: list[str], with_text: set[str] = frozenset()) -> dict:
    """{named, profiled, missing, skipped, absent, missing_ids, with_text, entries}: how many distinct ids of a prompt
    the set lacks (skipped at profile time or never seen); `with_text`: the ids the prompt gives as text, which a
    prefill can still compute densely (and `--profile-missing` profile)."""
    entries = id_status(path, list(dict.fromkeys(doc_ids)))
    missing = [e for e in entries if e["status"] != PROFILED]
    return {"named": len(entries), "profiled": len(entries) - len(missing), "missing": len(missing),
            "skipped": sum(e["status"] == SKIPPED for e in missing), "absent": sum(e["status"] == ABSENT for e in missing),
            "missing_ids": [e["doc_id"] for e in missing],
            "with_text": [e["doc_id"] for e in missing if e["doc_id"] in with_text], "entries": entries}
