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
import os
from pathlib import Path
from typing import Iterator

from .faults import kill_point

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
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


def drop_if_free(path: Path) -> bool:
    """Remove a flock lock file that no process holds (its holder was killed), found so by taking it; a held one,
    or one that cannot be removed (a read-only folder), is left. Returns whether it was removed."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            return False  # replaced meanwhile: someone else's
        os.unlink(path)  # while holding it: a process that opened it too sees it is gone and retries
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
