"""Per-bucket claims: a worker profiles a bucket only while it holds the bucket's lock, so two processes never write
one shard.

Before profiling a bucket a worker takes an exclusive lock on `.part-NNNNN.lock` in the output directory
(`fcntl.flock`; the kernel drops it when the process dies, SIGKILL included, so a dead worker never blocks a
bucket) and, holding it, checks again whether the shard is already finished. Two workers given the same rank
therefore never write the same shard at once: the second skips buckets held by the first, comes back to them at
the end and finds them done. The lock file is removed (while still locked) on release; a worker that locked an
already-removed file notices (its inode is no longer the path's) and retries. On file systems without `flock`
(some Lustre/NFS mounts) an O_EXCL lock file holding host, pid and a heartbeat is used instead; a lock whose
process is gone (same host) or whose heartbeat is older than `stale_after` seconds is broken.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

from ..atomic import pid_alive
from ..shards.names import part_index

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


def lock_path(out: Path, shard: int, exclusive_file: bool = False) -> Path:
    """`.part-NNNNN.lock` (flock) or `.part-NNNNN.xlock` (the O_EXCL fallback's lock file)."""
    return Path(out) / f".part-{shard:05d}.{'xlock' if exclusive_file else 'lock'}"


def _flock_unsupported(exc: OSError) -> bool:
    return exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class BucketClaims:
    """Claims on the buckets of one output directory, for one process.

    `claim(shard, wait)` is a context manager yielding True when this process holds the bucket (then it may
    write the shard) and False when another live process does (only with wait=False).
    """

    def __init__(self, out: str | Path, stale_after: float = 600.0, heartbeat: float = 30.0):
        self.out = Path(out)
        self.stale_after = stale_after
        self.heartbeat = heartbeat
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "nonce": uuid.uuid4().hex}
        self.use_flock = fcntl is not None

    def __call__(self, shard: int, wait: bool = False):
        return self.claim(shard, wait)

    @contextlib.contextmanager
    def claim(self, shard: int, wait: bool = False) -> Iterator[bool]:
        self.out.mkdir(parents=True, exist_ok=True)
        release = self._acquire_flock(lock_path(self.out, shard), wait) if self.use_flock else None
        if release is None:  # no flock here (now or found out just now)
            release = self._acquire_exclusive(lock_path(self.out, shard, exclusive_file=True), wait)
        if release is False:
            yield False
            return
        try:
            remove_tmp_files(self.out, shard)  # left by a writer of this bucket that died; none is alive now
            yield True
        finally:
            release()

    def index_lock(self):
        """The set's manifest lock, waited for: the manifest and the store are rewritten by one process at a time."""
        return self.named_lock(".manifest")

    @contextlib.contextmanager
    def named_lock(self, stem: str) -> Iterator[None]:
        """An exclusive lock on `STEM.lock` (flock) or `STEM.xlock` (the O_EXCL fallback) in the directory, waited
        for."""
        self.out.mkdir(parents=True, exist_ok=True)
        release = self._acquire_flock(self.out / f"{stem}.lock", True) if self.use_flock else None
        if release is None:
            release = self._acquire_exclusive(self.out / f"{stem}.xlock", True)
        try:
            yield
        finally:
            release()

    # -- flock: released by the kernel when the process dies -----------------------------------------------
    def _acquire_flock(self, path: Path, wait: bool):
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # mode: 0666 less the umask
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError as exc:
                os.close(fd)
                if _flock_unsupported(exc):
                    self.use_flock = False
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    return None
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder before us removed the file after we opened it: lock the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(self.owner).encode())

            def release(fd=fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # while still locked: a waiter on this inode sees it is gone and retries
                os.close(fd)

            return release

    # -- O_EXCL fallback: owner info + heartbeat, stale locks broken -------------------------------------------
    def _acquire_exclusive(self, path: Path, wait: bool):
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                if self._break_if_stale(path):
                    continue
                if not wait:
                    return False
                time.sleep(min(5.0, self.heartbeat))
                continue
            os.write(fd, json.dumps(self.owner).encode())
            os.close(fd)
            stop = threading.Event()

            def beat():
                while not stop.wait(self.heartbeat):
                    with contextlib.suppress(OSError):
                        os.utime(path)

            t = threading.Thread(target=beat, daemon=True)
            t.start()

            def release():
                stop.set()
                t.join()
                if _read_owner(path) == self.owner:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)

            return release

    def _break_if_stale(self, path: Path) -> bool:
        owner = _read_owner(path)
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return True
        if owner is None and age < 5:
            return False  # being written right now
        dead = (owner is not None and owner.get("host") == self.owner["host"]
                and not pid_alive(int(owner.get("pid", -1))))
        if not dead and age < self.stale_after:
            return False
        aside = path.with_name(f"{path.name}.stale-{self.owner['nonce']}")
        try:
            os.rename(path, aside)  # atomic: of several breakers only one moves this file
        except FileNotFoundError:
            return True
        if _read_owner(aside) != owner:  # moved a lock taken after we looked: put it back unless replaced
            with contextlib.suppress(OSError):
                os.link(aside, path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)
        return True


def _read_owner(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None


def remove_tmp_files(out: Path, shard: int) -> int:
    """Delete half-written temporaries of one bucket (`.part-NNNNN.parquet.*.tmp` and the store's
    `store/.part-NNNNN.sbits.*.tmp`), left by a killed writer; its claim is held."""
    n = 0
    out = Path(out)
    for p in [*out.glob(f".part-{shard:05d}.parquet.*.tmp"), *(out / "store").glob(f".part-{shard:05d}.sbits.*.tmp")]:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n


def busy_buckets(out: str | Path) -> list[int]:
    """Buckets some live process holds right now (a flock lock that is held; any O_EXCL lock file)."""
    held = []
    for p in sorted(Path(out).glob(".part-*.*lock")):
        try:
            shard = int(p.name[len(".part-"):].split(".", 1)[0])
        except ValueError:
            continue
        if fcntl is None or p.suffix == ".xlock":
            held.append(shard)
            continue
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(shard)
        except OSError:
            held.append(shard)
        finally:
            os.close(fd)
    return sorted(set(held))


def clean_leftovers(out: str | Path) -> int:
    """After every shard is done: remove the lock files and orphan temporaries of buckets no process holds.
    Whether one does is found by taking its claim (never by looking, then deleting: a worker could take the lock
    in between); holding it, the temporaries go (`remove_tmp_files`) and the lock file goes on release. Returns how
    many files were removed."""
    out = Path(out)
    shards = set()
    for p in list(out.glob(".part-*.lock")) + list(out.glob(".part-*.parquet.*.tmp")):  # never .xlock
        try:
            shards.add(part_index(p.name.removeprefix(".")))
        except ValueError:
            continue
    before = _leftover_count(out)
    claims = BucketClaims(out)
    for shard in sorted(shards):
        with claims.claim(shard, wait=False):
            pass
    return before - _leftover_count(out)


def _leftover_count(out: Path) -> int:
    return len(list(out.glob(".part-*.lock"))) + len(list(out.glob(".part-*.parquet.*.tmp")))
