"""Files that appear whole or not at all: written to a temporary name beside their place, flushed, then renamed
into place (the writer of every shard, store and record file)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


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


def atomic_write(path: Path, write) -> None:
    """Run write(tmp_path), then rename into place: a crash never leaves a readable half file at `path`. The file's
    mode follows the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temporary(path)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
