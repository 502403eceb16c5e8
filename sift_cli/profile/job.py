"""`sift profile` as a job: corpus → tokenised documents → hash buckets → one shard file per bucket.

A bucket's file is written atomically once every document in it is profiled, so a finished bucket is never
redone and a crashed one is redone whole; within a bucket the batches depend only on its documents, so a resumed
run writes exactly the bytes an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager

from .. import __version__
from ..config import ProfileConfig
from ..corpus import Corpus, CorpusFormat, Document, load_corpus
from ..errors import SiftError
from ..launch.claims import BucketClaims
from ..models import LoadedModel
from ..shards.files import ShardFile, list_parts, write_shard
from ..shards.manifest import write_manifest
from ..shards.format import FORMAT_VERSION, matching_keys, part_name, shard_of, token_sha256
from ..tokens import prefix_token_ids, tokenize_documents, tokenizer_info
from .batches import plan_batches
from .forward import launch_profile_batch
from .unreadable import recover_bucket

STRICT_REMEDY = "fix or remove {them}, or run without --strict to skip {them}"


@dataclass
class ProfileReport:
    out: str
    num_shards: int
    documents: int = 0  # in the corpus
    profiled: int = 0  # this run
    reused: int = 0  # already in finished shards
    skipped_too_long: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # every document not profiled: {doc_id, origin, reason}
    ignored_files: list[str] = field(default_factory=list)  # files of a corpus directory that are not documents
    skip_reasons: dict[str, str] = field(default_factory=dict)  # doc_id → why it was skipped
    tokens: int = 0  # profiled this run (documents only)
    shards_written: int = 0
    shards_reused: int = 0
    seconds: float = 0.0
    manifest: str | None = None
    prepare: dict = field(default_factory=dict)  # seconds before the first batch: read_corpus, tokenize
    startup: dict | None = None  # the worker's start-up before this job (launch.startup), set by launch.worker
    written: list[int] = field(default_factory=list)  # the buckets this run wrote
    set_aside: list[dict] = field(default_factory=list)  # unreadable part files renamed: {file, aside, documents, ...}

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {"out": self.out, "num_shards": self.num_shards, "documents": self.documents,
                "profiled": self.profiled, "reused": self.reused, "skipped_too_long": len(self.skipped_too_long),
                "skipped_doc_ids": self.skipped_too_long[:100], "skipped_documents": len(self.skipped),
                "skipped": self.skipped[:100], "ignored_files": self.ignored_files[:100], "tokens": self.tokens,
                "shards_written": self.shards_written, "shards_reused": self.shards_reused,
                "seconds": round(self.seconds, 3), "tokens_per_second": round(self.tokens_per_second, 1),
                "manifest": self.manifest, "prepare": {k: round(v, 3) for k, v in self.prepare.items()},
                "startup": self.startup, "set_aside": self.set_aside}


def shard_metadata(lm: LoadedModel, cfg: ProfileConfig, prefix_ids: list[int], num_shards: int) -> dict:
    return {
        "sift.format_version": FORMAT_VERSION,
        "sift.model": lm.model_metadata(),
        "sift.n_layers": lm.n_layers,
        "sift.n_heads": lm.n_heads,
        "sift.n_kv_heads": lm.n_kv_heads,
        "sift.head_dim": lm.head_dim,
        "sift.tile_size": cfg.tile,
        **cfg.rule_metadata(),
        "sift.prefix_token_ids": list(prefix_ids),
        "sift.tokenizer": tokenizer_info(lm.tokenizer),
        "sift.tool_version": __version__,
        "sift.num_shards": num_shards,
        "sift.max_context": lm.max_context,
    }


def check_compatible(out: Path, meta: dict) -> int | None:
    """num_shards of the shards already in `out` (None if empty); raise if they were made differently."""
    parts = list_parts(out) if out.is_dir() else []
    existing = None
    for part in parts:  # the first readable one: an unreadable file is set aside when its bucket is redone
        try:
            existing = ShardFile.open(part)
            break
        except SiftError:
            continue
    if existing is None:
        return None
    rules = existing.meta.get("sift.rule") or "paper", meta.get("sift.rule") or "paper"
    if rules[0] != rules[1]:
        raise SiftError(f"{out}: holds shards made with a different rule ({rules[0]}, not {rules[1]}); profile "
                        f"with --rule {rules[0]} or use another --out directory")
    for key in matching_keys():
        if key == "sift.num_shards":
            continue
        if existing.meta.get(key) != meta.get(key):
            raise SiftError(f"{out}: holds shards made with a different {key.removeprefix('sift.')} "
                            f"({existing.meta.get(key)!r} vs {meta.get(key)!r}); use another --out directory")
    return int(existing.meta["sift.num_shards"])


def default_num_shards(n_docs: int, docs_per_shard: int) -> int:
    return max(1, -(-n_docs // max(1, docs_per_shard)))


def profile_corpus(corpus: str | Path | Corpus, out: str | Path, lm: LoadedModel, cfg: ProfileConfig,
                   fmt: CorpusFormat = CorpusFormat(), num_shards: int | None = None, docs_per_shard: int = 1000,
                   strict: bool = False, prefix_text: str | None = None, only_shards: set[int] | None = None,
                   progress: Callable[[int, int], None] | None = None, write_index: bool = True,
                   claim: Callable[[int, bool], ContextManager[bool]] | None = None) -> ProfileReport:
    """Profile every document of `corpus` (a path, or what `corpus.load_corpus` read) into shards under `out`;
    resumable; returns what was done.

    Documents that cannot be profiled (empty, not UTF-8, longer than the model's context...) are skipped, listed
    in the report and recorded with their reason in their bucket's file (`sift.skipped`, `sift.skip_reasons`);
    strict: stop instead, listing them all, before any model work.
    only_shards: the buckets this worker owns (None: all). progress(done_tokens, total_tokens) is called as
    batches finish. claim(shard, wait): a context manager yielding whether this process may write that shard now
    (default: `launch.claims.BucketClaims`, a per-bucket lock in `out`, so concurrent workers never write one shard
    twice); buckets held elsewhere are retried, waiting, after the others.
    """
    cfg.check()
    out = Path(out)
    t0 = time.perf_counter()
    loaded = corpus if isinstance(corpus, Corpus) else load_corpus(corpus, fmt)
    if strict:
        loaded.check(STRICT_REMEDY)
    docs = loaded.documents
    read_seconds = time.perf_counter() - t0
    prefix_ids = prefix_token_ids(lm.tokenizer, prefix_text)
    meta = shard_metadata(lm, cfg, prefix_ids, 0)
    existing_shards = check_compatible(out, meta)
    if num_shards is None:
        num_shards = existing_shards or default_num_shards(len(docs), docs_per_shard)
    elif existing_shards is not None and existing_shards != num_shards:
        raise SiftError(f"{out}: holds a shard set of {existing_shards} shards, not {num_shards}; "
                        f"keep --num-shards {existing_shards} or use another --out directory")
    meta["sift.num_shards"] = num_shards
    report = ProfileReport(out=str(out), num_shards=num_shards, documents=len(docs),
                           skipped=[b.to_json() for b in loaded.bad],
                           ignored_files=[f.line() for f in loaded.ignored_files])

    report.prepare["read_corpus"] = read_seconds
    plans = _bucket_plans(docs, out, lm, prefix_ids, num_shards, only_shards, strict, report, loaded.bad)
    _profile_buckets(plans, out, lm, cfg, meta, prefix_ids, claim or BucketClaims(out), progress, report)

    if write_index and all((out / part_name(s)).is_file() for s in range(num_shards)):
        report.manifest = str(write_manifest(out))
    report.seconds = time.perf_counter() - t0
    return report


def _bucket_plans(docs: list[Document], out: Path, lm: LoadedModel, prefix_ids: list[int], num_shards: int,
                  only_shards: set[int] | None, strict: bool, report: ProfileReport, bad=()) -> list[tuple]:
    """(bucket, [(document, tokens) to profile], [doc_ids skipped: bad or too long]) of every bucket of this
    worker not finished yet, in bucket order; report.skip_reasons says why each was skipped. Everything is
    tokenised and length-checked before any model work, so --strict fails up front (listing every document)."""
    buckets: dict[int, list[Document]] = {}
    for d in docs:
        buckets.setdefault(shard_of(d.doc_id, num_shards), []).append(d)
    bad_ids: dict[int, list[str]] = {}
    for b in bad:
        if b.doc_id:  # a bad document with an id is recorded in its bucket, with its reason
            bad_ids.setdefault(shard_of(b.doc_id, num_shards), []).append(b.doc_id)
            report.skip_reasons[b.doc_id] = b.reason
    mine = sorted(s for s in range(num_shards) if only_shards is None or s in only_shards)

    todo = []
    for s in mine:
        members = sorted(buckets.get(s, []), key=lambda d: d.doc_id)
        done = _finished(out / part_name(s), {d.doc_id for d in members} | set(bad_ids.get(s, ())))
        if done is not None:
            report.shards_reused += 1
            report.reused += done
        else:
            todo.append((s, members))

    limit = lm.max_context
    plans, too_long = [], []
    for s, members in todo:
        t_tokenize = time.perf_counter()
        tokens = tokenize_documents(lm.tokenizer, members)
        report.prepare["tokenize"] = report.prepare.get("tokenize", 0.0) + time.perf_counter() - t_tokenize
        keep, skipped = [], []
        for d, t in zip(members, tokens):
            if len(prefix_ids) + len(t) > limit:
                reason = (f"longer than the model's context ({len(t)} tokens + the {len(prefix_ids)}-token prefix "
                          f"> {limit})")
                too_long.append(f"{d.origin}: document {d.doc_id!r} is {reason}")
                report.skip_reasons[d.doc_id] = reason
                report.skipped.append({"doc_id": d.doc_id, "origin": d.origin, "reason": reason})
                skipped.append(d.doc_id)
            else:
                keep.append((d, t))
        report.skipped_too_long.extend(skipped)
        plans.append((s, keep, skipped + bad_ids.get(s, [])))
    if strict and len(too_long) == 1:
        raise SiftError(f"{too_long[0]} — split it, or run without --strict to skip it")
    if strict and too_long:
        raise SiftError(f"{len(too_long)} documents are longer than the model's context of {limit} tokens — split "
                        f"them, or run without --strict to skip them", too_long)
    return plans


def _profile_buckets(plans: list[tuple], out: Path, lm: LoadedModel, cfg: ProfileConfig, meta: dict,
                     prefix_ids: list[int], claim, progress, report: ProfileReport) -> None:
    """Profile and write each planned bucket while holding its claim: first the free buckets, then, waiting, those
    another process was holding (they are usually finished by then)."""
    total_tokens = sum(len(t) for _, keep, _ in plans for _, t in keep)
    done_tokens = 0
    if progress:
        progress(0, total_tokens)  # the total is known before the first batch (tokenised up front)
    writer = _ShardWriter()
    try:
        for wait in (False, True):
            busy = []
            for s, keep, skipped in plans:
                with contextlib.ExitStack() as held:
                    if not held.enter_context(claim(s, wait)):
                        busy.append((s, keep, skipped))
                        continue
                    done = _finished(out / part_name(s), {d.doc_id for d, _ in keep} | set(skipped))
                    if done is not None:  # finished by another worker meanwhile
                        report.shards_reused += 1
                        report.reused += done
                        done_tokens += sum(len(t) for _, t in keep)
                        continue
                    added, keep = _added_rows(out / part_name(s), {d.doc_id for d, _ in keep} | set(skipped),
                                              keep, report)
                    rows, done_tokens = profile_rows(keep, lm, cfg, prefix_ids, progress, done_tokens, total_tokens)
                    rows += added
                    shard_meta = {**meta, "sift.shard_index": s, "sift.skipped": sorted(skipped),
                                  "sift.skip_reasons": {d: report.skip_reasons[d] for d in sorted(skipped)}}
                    # written on the writer thread; the claim is released there once the file is in place
                    writer.submit(lambda p=out / part_name(s), r=rows, m=shard_meta: write_shard(p, r, m), held)
                    report.shards_written += 1
                    report.written.append(s)
                    report.profiled += len(rows)
                    report.tokens += sum(len(t) for _, t in keep)
            plans = busy
    finally:
        writer.close()  # re-raises a failed write


def profile_rows(keep, lm, cfg, prefix_ids, progress, done_tokens, total_tokens) -> tuple[list[dict], int]:
    """Profile one bucket's documents: its shard rows, and the tokens done so far. Batch i + 1 is launched
    before batch i is collected, so the host builds rows while the GPU works (see `launch_profile_batch`)."""
    rows = []
    lengths = [len(t) for _, t in keep]
    show = _monotone(progress, total_tokens)
    launched_tokens = done_tokens

    def collect(batch, pending):
        nonlocal done_tokens
        for i, b in zip(batch, pending()):
            doc, tokens = keep[i]
            la, ca = b.pack()
            rows.append({"doc_id": doc.doc_id, "tokens": tokens, "token_sha256": token_sha256(tokens),
                         "n_tokens": len(tokens), "la_bits": la, "ca_bits": ca,
                         "la_density": b.la_density(), "ca_density": b.ca_density()})
            done_tokens += len(tokens)
        show(done_tokens)

    previous = None
    for batch in plan_batches(lengths, len(prefix_ids), cfg.batch_tokens):
        size = sum(lengths[i] for i in batch)
        on_layer = (lambda layers, base=launched_tokens, size=size:
                    show(base + size * layers // lm.n_layers))  # within a batch, as layers finish (a CPU)
        launched = (batch, launch_profile_batch(lm.model, prefix_ids, [keep[i][1] for i in batch], cfg, on_layer))
        launched_tokens += size
        if previous is not None:
            collect(*previous)
        previous = launched
    if previous is not None:
        collect(*previous)
    return rows, done_tokens


def _monotone(progress, total: int) -> Callable[[int], None]:
    """progress(done, total) that never goes back (layer-level updates can run ahead of the batch collected)."""
    shown = -1

    def show(done: int) -> None:
        nonlocal shown
        if progress and done > shown:
            shown = done
            progress(done, total)

    return show


class _ShardWriter:
    """Writes finished shards on one background thread (Parquet encoding and ZSTD release the GIL) while the next
    bucket is profiled; at most one write in flight. The bucket's claim (`held`, an ExitStack) moves to the writer
    and is released after the write, whether it succeeded or not; a failed write is re-raised by the next submit
    (before that bucket's claim moves, so its with-block still releases it) or by close."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sift-shard-writer")
        self._pending = None

    def submit(self, write: Callable[[], None], held: contextlib.ExitStack) -> None:
        self.wait()
        release = held.pop_all()

        def task():
            with release:
                write()

        try:
            self._pending = self._pool.submit(task)
        except BaseException:
            release.close()
            raise

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


def _added_rows(path: Path, corpus_ids: set[str], keep: list, report: ProfileReport) -> tuple[list[dict], list]:
    """(rows of a bucket's old file that are not the corpus's: documents added one prompt at a time, kept when the
    bucket is profiled again; the documents to profile). An unreadable old file is set aside and its added
    documents, recovered from the store, join those to profile (`profile/unreadable.py`)."""
    if not path.is_file():
        return [], keep
    try:
        rows = ShardFile.open(path).read().to_pylist()
    except SiftError:
        found = recover_bucket(path, corpus_ids)
        report.set_aside.append({k: found[k] for k in ("file", "aside", "documents")}
                                | {"recovered": len(found["recovered"])})
        return [], keep + found["recovered"]
    return [r for r in rows if r["doc_id"] not in corpus_ids], keep


def _finished(path: Path, expected_ids: set[str]) -> int | None:
    """Rows of a finished shard holding every id of `expected_ids` (profiled or skipped; documents added one
    prompt at a time may be there too); None: redo it."""
    if not path.is_file():
        return None
    try:
        shard = ShardFile.open(path)
        ids = shard.read(["doc_id"]).column("doc_id").to_pylist()
    except SiftError:
        return None  # unreadable: redo whole
    skipped = shard.meta.get("sift.skipped") or []
    if not expected_ids <= set(ids) | set(skipped):
        return None
    return len(ids)
