"""Files that appear whole or not at all: written to a temporary name beside their place (unique per process),
flushed, renamed into place and the directory flushed, so the rename itself survives a power cut (the writer of
every shard, store, manifest, record and config file)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from .faults import file_kind, kill_point


def _new_temporary(path: Path) -> str:
    """Create an empty temporary file beside `path` (`.NAME.RANDOM.tmp`), its mode 0666 less the umask as for any
    ordinary file (tempfile.mkstemp would make it 0600, unreadable to the other users of a shared cluster)."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (a rename in it) to disk; a no-op where directories cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, write) -> None:
    """Run write(tmp_path), then rename into place: a crash never leaves a readable half file at `path`, and a
    failed write leaves nothing behind. The file's mode follows the umask."""
    path = Path(path)
    kind = file_kind(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kill_point(f"{kind}:before-write")
    tmp = _new_temporary(path)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        kill_point(f"{kind}:before-rename")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_directory(path.parent)
    kill_point(f"{kind}:after-rename")
