"""Files that appear whole or not at all: written to a temporary name beside their place (unique per process),
flushed, renamed into place and the directory flushed, so the rename itself survives a power cut (the writer of
every shard, store, manifest, record and config file)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from pathlib import Path

from .faults import file_kind, kill_point

_HOST = socket.gethostname().replace(".", "_").replace("~", "_")


def _new_temporary(path: Path) -> str:
    """Create an empty temporary file beside `path` (`.NAME.HOST~PID~RANDOM.tmp`: its writer can be told dead), its
    mode 0666 less the umask as for any ordinary file (tempfile.mkstemp would make it 0600, unreadable to the other
    users of a shared cluster)."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{_HOST}~{os.getpid()}~{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def remove_dead_temporaries(directory: Path, pattern: str = ".*.tmp") -> int:
    """Remove the temporaries in `directory` whose writer was a process of this host that is gone (killed before
    its rename): a temporary's name is its writer's alone, so no live process can need it. Returns how many."""
    n = 0
    for p in Path(directory).glob(pattern):
        fields = p.name[:-len(".tmp")].rsplit(".", 1)[-1].split("~")
        if len(fields) != 3 or fields[0] != _HOST or not fields[1].isdigit() or pid_alive(int(fields[1])):
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs on this host (one we may not signal counts as running)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
