"""`sift ids`: every doc_id of a shard file or directory with its status — profiled (its file and token count) or
skipped when the set was profiled (and why: longer than the model's context, an empty document...).

`DocIdListing` reads the part files (no manifest needed, so an unfinished set can be listed too) and yields the
entries in doc_id order, the files' id columns sorted together in Arrow: memory holds the ids as Arrow arrays,
never one Python object per document at once. `id_status` says, for the ids a caller names, which the set holds (a point
read where the set has a serving store), which were skipped and which it never saw; `prompt_ids_report` sums that
up for the ids of a prompt (`sift ids --docs`, `sift status --docs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..store.bitstore import BitStore
from ..store.layout import SET_FILE, STORE_DIR
from .files import ShardFile, shard_paths, shared_metadata, skipped_documents
from .names import part_name, shard_of

PROFILED, SKIPPED, ABSENT = "profiled", "skipped", "absent"
_LISTING = pa.schema([("doc_id", pa.string()), ("n_tokens", pa.int32()), ("code", pa.int32())])


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

    def _table(self) -> tuple[pa.Table, list[str]]:
        """(every profiled and skipped id with a code and token count, unsorted; the codes' meaning: the files'
        names, then the skip reasons). Arrow columns, a few bytes per document besides its id."""
        names = [f.path.name for f in self._files] + list(self.skipped_reasons.values())
        parts = []
        for k, f in enumerate(self._files):
            t = f.read(["doc_id", "n_tokens"])
            parts.append(pa.table({"doc_id": t.column("doc_id"), "n_tokens": t.column("n_tokens"),
                                   "code": pa.repeat(k, t.num_rows).cast(pa.int32())}, schema=_LISTING))
        first = len(self._files)
        parts.append(pa.table({"doc_id": list(self.skipped_reasons), "n_tokens": pa.repeat(0, self.skipped),
                               "code": range(first, first + self.skipped)}, schema=_LISTING))
        return pa.concat_tables(parts).combine_chunks(), names

    def __iter__(self) -> Iterator[dict]:
        table, names = self._table()
        order = pc.sort_indices(table, [("doc_id", "ascending")])
        skipped_from = len(self._files)
        for i in range(0, len(order), 8192):  # Python objects a slice at a time, no sorted copy of the table
            cols = table.take(order.slice(i, 8192)).to_pydict()
            for d, n, code in zip(cols["doc_id"], cols["n_tokens"], cols["code"]):
                yield ({"doc_id": d, "status": SKIPPED, "reason": names[code]} if code >= skipped_from
                       else {"doc_id": d, "status": PROFILED, "file": names[code], "n_tokens": n})

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
