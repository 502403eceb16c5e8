"""`BitStore`: a shard set's serving store opened once for many lookups (a server, a batch job).

Opening reads `store/set.json` and nothing per document. A lookup hashes the id to its bucket, maps that bucket's
file (once; kept open), binary-searches its sorted keys in place and copies out the one record, its checksum
verified: it reads about that document's bytes whatever the set's size. A bucket file is checked when first
mapped (header and table checksums, the set it belongs to, the part file it was built from): a damaged or stale
one is refused with one line, never read. Documents added to the set later are found: a miss re-checks whether the
bucket's file was replaced since it was mapped. Safe from several threads; an optional DRAM cache keeps the most
recently used records up to a size cap. Standard library and numpy only: no Arrow, no torch.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ..errors import SiftError
from ..shards.names import doc_key, part_name
from ..shards.record import DocRecord, SetMetadata, absent_line, raise_missing
from .layout import (HEADER, MAGIC, SET_FILE, STORE_DIR, VERSION, BucketView, Record, StoreDamage, bucket_file_name,
                     part_fingerprint, table_end)

_SPARE_FDS = 256  # file descriptors left to the rest of the process


class _Bucket:
    """One bucket file held open: its table mapped (binary search in place), its records read with `pread`, so the
    process maps no record pages (its resident memory does not grow with the documents it has read). The file is
    closed when the last reference goes (an evicted bucket stays usable by a lookup in flight)."""

    def __init__(self, view: BucketView | None, fd: int | None = None, identity: tuple | None = None):
        self.view, self.fd, self.identity = view, fd, identity  # view None: no part file for this bucket yet

    def __del__(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class StoreStats:
    lookups: int = 0  # documents asked for
    cache_hits: int = 0
    bytes_read: int = 0  # bytes of store and part files the lookups read (tables once per bucket, then records)
    buckets_opened: int = 0


class BitStore(SetMetadata):
    """The serving store of the shard set in `directory` (built by `sift profile`, `sift index`). cache_bytes: the
    DRAM cache's cap (0: none; the OS page cache still keeps hot pages). max_open: buckets kept mapped at once
    (default: all the set has, the process's open-file limit raised to allow it where the hard limit permits)."""

    def __init__(self, directory: str | Path, cache_bytes: int = 0, max_open: int | None = None):
        self.dir = Path(directory)
        header_path = self.dir / STORE_DIR / SET_FILE
        try:
            import json
            header = json.loads(header_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SiftError(f"{self.dir}: no serving store ({STORE_DIR}/{SET_FILE}); build it with "
                            f"`sift index {self.dir}`") from None
        except (OSError, ValueError) as exc:
            raise SiftError(f"{header_path}: unreadable ({exc}); rebuild it with `sift index {self.dir}`") from exc
        if header.get("version") != VERSION:
            raise SiftError(f"{header_path}: store format version {header.get('version')}, this sift reads "
                            f"{VERSION}; rebuild it with `sift index {self.dir} --rebuild`")
        self.meta: dict = header["meta"]
        self.digest: str = header["digest"]
        self.num_shards: int = int(header["num_shards"])
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._buckets: OrderedDict[int, _Bucket] = OrderedDict()
        self._max_open = max_open or _open_file_budget(self.num_shards)
        self._cache: OrderedDict[str, Record] = OrderedDict()
        self._cache_cap = max(0, int(cache_bytes))
        self._cache_size = 0

    # -- lookups -------------------------------------------------------------------------------------------------
    def record(self, doc_id: str) -> Record | None:
        """The stored record of `doc_id` (tokens as int32 bytes), or None when the set does not hold it."""
        with self._lock:
            self.stats.lookups += 1
            hit = self._cache.get(doc_id)
            if hit is not None:
                self._cache.move_to_end(doc_id)
                self.stats.cache_hits += 1
                return hit
        key = doc_key(doc_id)
        shard = key % self.num_shards
        bucket = self._bucket(shard)
        try:
            rec, read = (None, 0) if bucket.view is None else bucket.view.lookup(doc_id, key)
            if rec is None and self._replaced(shard, bucket):  # written since it was mapped: documents were added
                bucket = self._bucket(shard, reopen=True)
                rec, more = (None, 0) if bucket.view is None else bucket.view.lookup(doc_id, key)
                read += more
        except StoreDamage as exc:
            raise self._damaged(exc) from None
        with self._lock:
            self.stats.bytes_read += read
            if rec is not None and self._cache_cap:
                self._remember(rec)
        return rec

    def records(self, doc_ids: list[str]) -> dict[str, DocRecord]:
        """The records of the ids of `doc_ids` this set holds (the others are left out)."""
        out = {}
        for d in dict.fromkeys(doc_ids):
            rec = self.record(d)
            if rec is not None:
                out[d] = DocRecord(d, rec.token_list(), rec.la_bits, rec.ca_bits)
        return out

    def get(self, doc_ids: list[str]) -> list[DocRecord]:
        """The records of `doc_ids`, in order; one error line (or one per id) for ids the set lacks."""
        found = self.records(doc_ids)
        self._raise_missing([d for d in doc_ids if d not in found])
        return [found[d] for d in doc_ids]

    def bits(self, doc_ids: list[str]) -> tuple[list[bytes], list[bytes]]:
        """The LA and CA bit vectors of `doc_ids`, in order: what SIFT's prefill fetches per prompt."""
        la, ca, missing = [], [], []
        for d in doc_ids:
            rec = self.record(d)
            if rec is None:
                missing.append(d)
                continue
            la.append(rec.la_bits)
            ca.append(rec.ca_bits)
        self._raise_missing(missing)
        return la, ca

    def missing(self, doc_ids: list[str]) -> list[str]:
        """The ids of `doc_ids` this set lacks, in order."""
        return [d for d in doc_ids if d not in self]

    def __contains__(self, doc_id: str) -> bool:
        return self.record(doc_id) is not None

    def skip_reason(self, doc_id: str) -> str | None:
        """Why `doc_id` was not profiled when this set was made (None: it was, or the corpus had no such id)."""
        bucket = self._bucket(doc_key(doc_id) % self.num_shards)
        return None if bucket.view is None else (bucket.view.meta.get("skipped") or {}).get(doc_id)

    def absent(self, doc_id: str) -> str:
        """An error line for an id this set does not hold: skipped at profile time (and why), or not in it."""
        return absent_line(self.dir, doc_id, self.skip_reason(doc_id))

    def count(self) -> int:
        """Documents in the set (maps every bucket: a full pass over the set's tables)."""
        return sum(b.view.n for b in (self._bucket(s) for s in range(self.num_shards)) if b.view is not None)

    def doc_ids(self) -> list[str]:
        """Every id the set holds (reads every record: for tests and tools, not the request path)."""
        return [r.doc_id for s in range(self.num_shards) for r in self._all_records(s)]

    def close(self) -> None:
        with self._lock:
            self._buckets.clear()
            self._cache.clear()
            self._cache_size = 0

    def __enter__(self) -> "BitStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- buckets -------------------------------------------------------------------------------------------------
    def _bucket_path(self, shard: int) -> Path:
        return self.dir / STORE_DIR / bucket_file_name(shard)

    def _bucket(self, shard: int, reopen: bool = False) -> _Bucket:
        with self._lock:
            bucket = self._buckets.get(shard)
            if bucket is not None and not reopen:
                self._buckets.move_to_end(shard)
                return bucket
        bucket, read = self._map(shard)  # outside the lock: other threads' lookups go on meanwhile
        with self._lock:
            self._buckets[shard] = bucket
            self._buckets.move_to_end(shard)
            while len(self._buckets) > self._max_open:
                self._buckets.popitem(last=False)  # unmapped once no lookup in flight holds it
            self.stats.buckets_opened += 1
            self.stats.bytes_read += read
        return bucket

    def _map(self, shard: int) -> tuple[_Bucket, int]:
        path, part = self._bucket_path(shard), self.dir / part_name(shard)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if not part.is_file():
                return _Bucket(None), 0  # the set has no such bucket yet: nothing to find
            raise SiftError(f"{path}: missing, so {part.name}'s documents cannot be served — build it with "
                            f"`sift index {self.dir}`") from None
        bucket = _Bucket(None, fd)  # closes fd if anything below fails
        st = os.fstat(fd)
        try:
            head = os.pread(fd, HEADER.size, 0)
            end = table_end(head) if len(head) == HEADER.size else 0
            if end > st.st_size or len(head) < HEADER.size or head[:8] != MAGIC:
                table = head  # BucketView says what is wrong with it
            else:
                table = mmap.mmap(fd, end, access=mmap.ACCESS_READ)
                if hasattr(table, "madvise"):  # point reads: no read-around of megabytes per fault
                    table.madvise(mmap.MADV_RANDOM)
            view = BucketView(table, path.name, st.st_size, lambda o, n: os.pread(fd, n, o))
        except StoreDamage as exc:
            raise self._damaged(exc) from None
        if view.meta.get("set_digest") != self.digest:
            raise SiftError(f"{path}: built for other settings than {STORE_DIR}/{SET_FILE} says — rebuild the store "
                            f"with `sift index {self.dir} --rebuild`")
        recorded = view.meta.get("part") or {}
        try:
            current = part_fingerprint(part)
        except FileNotFoundError:
            raise SiftError(f"{path}: its part file {part.name} is gone — run `sift validate {self.dir}`") from None
        if {k: recorded.get(k) for k in current} != current:
            raise SiftError(f"{path} is stale: {part.name} changed after it was built — rebuild it with "
                            f"`sift index {self.dir}`")
        bucket.view, bucket.identity = view, (st.st_ino, st.st_size, st.st_mtime_ns)
        return bucket, view.touched + 4096

    def _replaced(self, shard: int, bucket: _Bucket) -> bool:
        try:
            st = os.stat(self._bucket_path(shard))
        except FileNotFoundError:
            return bucket.identity is not None
        return (st.st_ino, st.st_size, st.st_mtime_ns) != bucket.identity

    def _all_records(self, shard: int):
        bucket = self._bucket(shard)
        if bucket.view is None:
            return []
        try:
            return list(bucket.view.records())
        except StoreDamage as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc: Exception) -> SiftError:
        return SiftError(f"{exc} — the store file is damaged; rebuild it with `sift index {self.dir} --verify`")

    def _remember(self, rec: Record) -> None:
        size = len(rec.tokens) + len(rec.la_bits) + len(rec.ca_bits)
        if size > self._cache_cap or rec.doc_id in self._cache:
            return
        self._cache[rec.doc_id] = rec
        self._cache_size += size
        while self._cache_size > self._cache_cap:
            _, old = self._cache.popitem(last=False)
            self._cache_size -= len(old.tokens) + len(old.la_bits) + len(old.ca_bits)

    def _raise_missing(self, missing: list[str]) -> None:
        raise_missing(self.dir, missing, self.absent)


def _open_file_budget(buckets: int) -> int:
    """How many bucket files to keep mapped (each holds a file descriptor): all of them when the open-file limit
    allows, raising its soft limit up to the hard one where needed, as servers do."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return max(16, min(buckets, 256))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = buckets + _SPARE_FDS
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if new > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
                soft = new
            except (ValueError, OSError):
                pass
    if soft == resource.RLIM_INFINITY:
        return buckets
    return max(16, min(buckets, soft - _SPARE_FDS))
