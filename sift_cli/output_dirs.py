"""Folders a command writes into: checked before any model work (a folder that cannot be written is a second's
error, not one after the model loaded and the work was done), and a full disk said in one line."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from .errors import SiftError
from .sizes import binary_bytes


def check_writable_dir(path: str | Path, flag: str) -> None:
    """Refuse `path` (given as `flag`) unless it is a folder this process can create files in, or one it can
    create. Tried with a real file, which also catches read-only file systems and, for root, permissions a mode
    check would miss."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SiftError(f"{flag} {p} is a file, not a folder — give a folder (created if needed)")
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SiftError(f"{flag} {p}: {existing} is a file, so the folder cannot be created — give another path")
    try:
        _probe(existing)
    except OSError as exc:
        where = "" if existing == p else f" (in {existing}, where it would be created)"
        raise SiftError(f"{flag} {p}: cannot write there{where}: {exc.strerror or exc} — choose a writable folder "
                        f"or change its permissions") from None


def _probe(directory: Path) -> None:
    fd, name = tempfile.mkstemp(prefix=".sift-write-check-", dir=directory)
    os.close(fd)
    os.unlink(name)


def is_disk_full(exc: BaseException) -> bool:
    """An OSError of a full disk, also as Arrow reports it (its errno only in the message)."""
    return isinstance(exc, OSError) and (exc.errno == errno.ENOSPC or "No space left on device" in str(exc))


def disk_full_error(exc: OSError, path: str | Path | None = None, needed: int | None = None) -> SiftError:
    """The one line for a full disk: the file being written (or `path`), the space free there, and what was
    needed when known."""
    where = Path(exc.filename) if getattr(exc, "filename", None) else (Path(path) if path is not None else None)
    free = ""
    if where is not None:
        folder = where
        while not folder.is_dir() and folder != folder.parent:
            folder = folder.parent
        try:
            free = f"{binary_bytes(shutil.disk_usage(folder).free)} free"
        except OSError:
            pass
    need = f"{binary_bytes(needed)} needed" if needed is not None else ""
    space = ", ".join(x for x in (need, free) if x)
    return SiftError(f"{where if where is not None else 'writing'}: no space left on the device"
                     + (f" ({space})" if space else "") + " — free some space or write to another disk; "
                     "work already finished is kept")
