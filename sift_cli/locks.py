"""The locks of a shard set and of the sift cache, in one place (docs/concurrency.md says which file each guards).

Locks are `flock`s on lock files (the kernel drops them when their process dies, SIGKILL included) or, where the
file system has no flock, O_EXCL lock files with a heartbeat (`launch.claims`). A stale lock is found by trying
to take it, never by looking and then deleting.

One order, so that no two writers wait on each other: the manifest lock may be held while taking bucket claims
(`store.index.index_set` rebuilding a bucket file), never the other way round — a process holding a bucket claim
releases it before it waits for the manifest lock. The GGUF cache lock and `sift.toml` (written atomically, no
lock: the last calibration wins whole) are independent of both.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from .faults import kill_point
from .launch.claims import BucketClaims


def bucket_claims(directory: str | Path) -> BucketClaims:
    """The per-bucket claims of a set: a bucket's part file and store file are written only by their holder."""
    return BucketClaims(directory)


@contextlib.contextmanager
def manifest_lock(directory: str | Path) -> Iterator[None]:
    """Held by every writer of `manifest.parquet` and of `store/set.json` and the store's bucket files built by
    `index_set`: the end of `sift profile`, `sift status --finalize`, each addition, `sift index`."""
    with BucketClaims(directory).index_lock():
        kill_point("manifest:locked")
        yield


@contextlib.contextmanager
def cache_lock(directory: Path, stem: str) -> Iterator[None]:
    """An exclusive lock on `directory/STEM.lock` (or `.xlock` where flock is unavailable), waited for: the
    conversion of one GGUF checkpoint into the cache."""
    with BucketClaims(directory).named_lock(stem):
        yield
