"""Documents added to a shard set one prompt at a time (`sift prefill --profile-missing`, `add_documents`).

The same path as `sift profile`, bucket by bucket: each document goes to the bucket its id hashes to; holding
that bucket's claim, the writer reads the bucket's file, profiles the documents it lacks with the job's own
batching (`profile_rows`, so the bits are the ones `sift profile` writes), and replaces the file atomically with
the old rows plus the new ones. The manifest is then rewritten under the set's manifest lock, so concurrent writers
(other prompts, other processes, a running `sift profile`) leave every file whole and the last manifest complete;
nothing written, the manifest is left as it is.

The shard set keeps its thresholds, tile, prompt prefix, model and bucket count: a set made with other ones is
refused. A new directory gets `NEW_SET_SHARDS` buckets, all written (empty ones too) so it is a finished set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ProfileConfig
from ..corpus import Document
from ..errors import SiftError
from ..locks import drop_if_free
from ..launch.claims import BucketClaims
from ..models import LoadedModel
from ..shards.files import ShardFile, skipped_documents, write_shard
from ..shards.manifest import write_manifest
from ..shards.format import MANIFEST, part_name, shard_of, token_sha256
from ..tokens import tokenize_documents
from .job import check_compatible, profile_rows, shard_metadata

NEW_SET_SHARDS = 8  # a set that grows a prompt at a time: small files, few rewritten per addition


@dataclass
class AddReport:
    out: str
    added: list[str] = field(default_factory=list)  # profiled and written now
    present: list[str] = field(default_factory=list)  # already in the set with the same tokens
    conflicts: list[str] = field(default_factory=list)  # in the set with other tokens: left as stored
    skipped_too_long: list[str] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    manifest: str | None = None

    def to_json(self) -> dict:
        return {"out": self.out, "added": self.added, "present": self.present, "conflicts": self.conflicts,
                "skipped_too_long": self.skipped_too_long, "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "manifest": self.manifest}


def add_documents(out: str | Path, docs: list[Document], lm: LoadedModel, cfg: ProfileConfig,
                  prefix_ids: list[int], claims: BucketClaims | None = None) -> AddReport:
    """Profile the documents of `docs` that the shard set `out` lacks and add them to it (see the module)."""
    cfg.check()
    out = Path(out)
    t0 = time.perf_counter()
    report = AddReport(out=str(out))
    ids = [d.doc_id for d in docs]
    if len(set(ids)) != len(ids):
        raise SiftError("documents to add have duplicate ids")
    meta = shard_metadata(lm, cfg, prefix_ids, 0)
    num_shards = check_compatible(out, meta) or NEW_SET_SHARDS
    meta["sift.num_shards"] = num_shards
    claims = claims or BucketClaims(out)
    tokens = dict(zip(ids, tokenize_documents(lm.tokenizer, docs)))
    buckets: dict[int, list[Document]] = {s: [] for s in range(num_shards) if not (out / part_name(s)).is_file()}
    for d in docs:
        buckets.setdefault(shard_of(d.doc_id, num_shards), []).append(d)
    wrote = False
    for s, members in sorted(buckets.items()):
        with claims.claim(s, wait=True):
            wrote |= _add_to_bucket(out, s, members, tokens, lm, cfg, prefix_ids, meta, report)
    if wrote or _index_behind(out):
        write_manifest(out)  # under the manifest lock, taken with no bucket claim held
    else:
        drop_if_free(out / ".manifest.lock")  # a killed writer's
    report.manifest = str(out / MANIFEST)
    report.seconds = time.perf_counter() - t0
    return report


def _add_to_bucket(out: Path, s: int, members: list[Document], tokens: dict, lm: LoadedModel, cfg: ProfileConfig,
                   prefix_ids: list[int], meta: dict, report: AddReport) -> bool:
    """Holding bucket s's claim: its file's rows plus the members it lacks, written atomically (the documents
    skipped at profile time stay recorded with their reasons). Returns whether the file was written."""
    path = out / part_name(s)
    rows, skipped = [], {}
    if path.is_file():
        shard = ShardFile.open(path)
        rows = shard.read().to_pylist()
        skipped = skipped_documents([shard])
    stored = {r["doc_id"]: r["token_sha256"] for r in rows}
    keep = []
    for d in members:
        t = tokens[d.doc_id]
        if d.doc_id in stored:
            (report.present if stored[d.doc_id] == token_sha256(t) else report.conflicts).append(d.doc_id)
        elif len(prefix_ids) + len(t) > lm.max_context:
            report.skipped_too_long.append(d.doc_id)
        else:
            keep.append((d, t))
    if path.is_file() and not keep:
        return False
    new_rows, _ = profile_rows(keep, lm, cfg, prefix_ids, None, 0, 0)
    added = {d.doc_id for d, _ in keep}
    skipped = {d: why for d, why in skipped.items() if d not in added}
    write_shard(path, rows + new_rows, {**meta, "sift.shard_index": s, "sift.skipped": sorted(skipped),
                                        "sift.skip_reasons": skipped})
    report.added.extend(d.doc_id for d, _ in keep)
    report.tokens += sum(len(t) for _, t in keep)
    return True



def _index_behind(out: Path) -> bool:
    """Whether the manifest is missing or older than a part file (a writer died between the two): then it and the
    store are brought up to date even when nothing is added now."""
    try:
        written = (out / MANIFEST).stat().st_mtime_ns
    except FileNotFoundError:
        return True
    return any(p.stat().st_mtime_ns > written for p in out.glob("part-*.parquet"))
