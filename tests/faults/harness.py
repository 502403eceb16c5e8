"""Running a writer in a real child process that SIGKILLs itself at a named stage (`sift_cli.faults`), runs under
a file-size limit, or runs beside another; and the checks every case ends with.

Children come from a fork server (multiprocessing's "forkserver"), which imports torch and sift once and has never
run a tokenizer: a child forked from the test process itself would hang in the tokenizer's thread pool. A job is
(operation, arguments) from `operations.py`, so that it can be sent to the server."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import resource
import signal
import sys
import traceback
from pathlib import Path

import pyarrow.parquet as pq

from sift_cli.errors import SiftError
from sift_cli.faults import KILL_ENV
from sift_cli.shards.files import list_parts
from sift_cli.shards.validate import validate_path
from sift_cli.store.bitstore import BitStore

KILLED, DONE, REFUSED = "killed", "done", "refused"

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch", "transformers", "sift_cli.profile.additions", "sift_cli.shards.status",
                                 "tests.faults.operations"])


def _child(job: tuple, kill_at: str | None, file_size: int | None) -> None:
    faulthandler.dump_traceback_later(120, exit=True)  # a hung child says where, then ends
    if kill_at:
        os.environ[KILL_ENV] = kill_at
    if file_size is not None:  # a full disk: writes past the limit fail (EFBIG) instead of killing
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    from . import operations

    try:
        getattr(operations, job[0])(*job[1:])
    except BaseException:  # noqa: BLE001 - a child reports by its exit code (and its error on stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
    os._exit(0)


def start(job: tuple, kill_at: str | None = None, file_size: int | None = None):
    p = _CONTEXT.Process(target=_child, args=(job, kill_at, file_size))
    p.start()
    return p


def outcome(p) -> str:
    p.join()
    if p.exitcode < 0:
        assert p.exitcode == -signal.SIGKILL, f"child died of signal {-p.exitcode}"
        return KILLED
    return DONE if p.exitcode == 0 else REFUSED


def run(job: tuple, kill_at: str | None = None, file_size: int | None = None) -> str:
    return outcome(start(job, kill_at, file_size))


def set_rows(directory: Path) -> dict:
    """Every part file's rows (all columns) and skipped documents, by file name: what two runs must agree on."""
    found = {}
    for p in list_parts(Path(directory)):
        t = pq.read_table(p)
        meta = t.schema.metadata or {}
        found[p.name] = (t.to_pylist(), meta.get(b"sift.skipped"))
    return found


def leftovers(directory: Path) -> list[str]:
    """Temporaries, lock files and set-aside files in a set (or any folder) and its store."""
    directory = Path(directory)
    names = []
    for d in (directory, directory / "store"):
        if d.is_dir():
            names += [p.name for p in d.iterdir() if p.name.endswith((".tmp", ".lock", ".xlock", ".unreadable"))
                      or p.name.startswith(".tmp-")]
    return sorted(names)


def check_set(directory: Path, expected: dict) -> None:
    """A finished set: valid, the same rows as the reference, every document served by the store, no leftovers."""
    report = validate_path(directory, workers=1)
    assert report["ok"], report["problems"][:3]
    assert set_rows(directory) == expected
    ids = sorted(r["doc_id"] for rows, _ in expected.values() for r in rows)
    with BitStore(directory) as store:
        got = store.get(ids)
    by_id = {r["doc_id"]: r for rows, _ in expected.values() for r in rows}
    assert [(g.la_bits, g.ca_bits) for g in got] == [(by_id[i]["la_bits"], by_id[i]["ca_bits"]) for i in ids]
    assert leftovers(directory) == [], leftovers(directory)


def damage_named(directory: Path) -> None:
    """After a fault and before recovery: `sift validate` passes or names what is wrong, never crashes."""
    try:
        report = validate_path(directory, workers=1)
    except SiftError as exc:  # nothing to validate yet (no part file): one line saying so
        assert str(exc)
        return
    assert report["ok"] or all(p["message"] for p in report["problems"]), report
