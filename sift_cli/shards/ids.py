"""`sift ids`: every doc_id of a shard file or directory with its status — profiled (its file and token count) or
skipped when the set was profiled (and why: longer than the model's context, an empty document...).

`doc_id_listing` reads the part files (no manifest needed, so an unfinished set can be listed too); `id_status`
says, for the ids a caller names, which the set holds, which were skipped and which it never saw, and
`prompt_ids_report` sums that up for the ids of a prompt (`sift ids --docs`, `sift status --docs`).
"""

from __future__ import annotations

from pathlib import Path

from .files import ShardFile, shard_paths, shared_metadata, skipped_documents

PROFILED, SKIPPED, ABSENT = "profiled", "skipped", "absent"


def doc_id_listing(path: str | Path) -> dict:
    """{path, files, profiled, skipped, documents: [{doc_id, status, file, n_tokens} | {doc_id, status, reason}]},
    documents sorted by doc_id. The files must make one shard set (as for every command that opens one)."""
    files = [ShardFile.open(p) for p in shard_paths(Path(path))]
    shared_metadata(files)
    docs = []
    for f in files:
        t = f.read(["doc_id", "n_tokens"])
        for doc_id, n in zip(t.column("doc_id").to_pylist(), t.column("n_tokens").to_pylist()):
            docs.append({"doc_id": doc_id, "status": PROFILED, "file": f.path.name, "n_tokens": n})
    profiled = len(docs)
    skipped = skipped_documents(files)
    docs.extend({"doc_id": d, "status": SKIPPED, "reason": reason} for d, reason in skipped.items())
    docs.sort(key=lambda r: r["doc_id"])
    return {"path": str(path), "files": len(files), "profiled": profiled, "skipped": len(skipped),
            "documents": docs}


def id_status(listing: dict, doc_ids: list[str]) -> list[dict]:
    """The entry of each of `doc_ids` in a `doc_id_listing`, in order; ids the set never saw are `absent`."""
    by_id = {r["doc_id"]: r for r in listing["documents"]}
    return [by_id.get(d, {"doc_id": d, "status": ABSENT}) for d in doc_ids]


def prompt_ids_report(listing: dict, doc_ids: list[str], with_text: set[str] = frozenset()) -> dict:
    """{named, profiled, missing, skipped, absent, missing_ids, with_text}: how many distinct ids of a prompt the set
    lacks (skipped at profile time or never seen); `with_text`: the ids the prompt gives as text, which a prefill
    can still compute densely (and `--profile-missing` profile)."""
    entries = id_status(listing, list(dict.fromkeys(doc_ids)))
    missing = [e for e in entries if e["status"] != PROFILED]
    return {"named": len(entries), "profiled": len(entries) - len(missing), "missing": len(missing),
            "skipped": sum(e["status"] == SKIPPED for e in missing), "absent": sum(e["status"] == ABSENT for e in missing),
            "missing_ids": [e["doc_id"] for e in missing],
            "with_text": [e["doc_id"] for e in missing if e["doc_id"] in with_text], "entries": entries}
