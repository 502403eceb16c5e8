"""Worker records: one small JSON file per worker and run in the shard directory, under `.sift-workers/`, saying
which worker profiled there (rank, host, pid, device), how long its start-up took and in which phases
(`startup.py`), and what it did (shards written, tokens, seconds).

A record is written when the worker's first batch is done (state `profiling`) and rewritten when it ends
(`finished`, or `failed` with the error), each time atomically. Every run adds its own files, so the records
survive resumes and any number of workers; shards never hold them, so shards stay byte-identical whoever wrote
them. `sift status` lists them (`shards.status.shard_status`); a `profiling` record whose process is gone (same
host) is reported as `ended` (killed before it could say).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path

from ..shards.files import atomic_write
from ..atomic import pid_alive

RECORDS_DIR = ".sift-workers"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class WorkerRecord:
    """The record file of one worker run in `out`; `write(**fields)` updates and rewrites it (never raising: a
    record is informational and must not stop profiling)."""

    def __init__(self, out: str | Path, rank: dict, device: str, startup: dict | None):
        now = time.time()
        host = socket.gethostname()
        safe_host = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:64] or "host"
        name = (f"worker-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}-r{rank.get('rank', 0)}-{safe_host}-"
                f"{os.getpid()}-{uuid.uuid4().hex[:6]}.json")
        self.path = Path(out) / RECORDS_DIR / name
        started = now - float((startup or {}).get("seconds") or 0.0)
        self.data = {"rank": rank.get("rank"), "world_size": rank.get("world_size"), "rank_source": rank.get("source"),
                     "host": host, "pid": os.getpid(), "device": device, "started_at": _utc(started),
                     "state": "starting", "startup": startup}
        self.written = False

    def write(self, **fields) -> None:
        self.data.update(fields, updated_at=_utc(time.time()))
        text = json.dumps(self.data, indent=1)
        with contextlib.suppress(OSError):
            atomic_write(self.path, lambda tmp: Path(tmp).write_text(text))
            self.written = True


def read_worker_records(out: str | Path) -> list[dict]:
    """Every readable record in `out`, oldest first, each with its file name; a `profiling` record whose process
    is gone (same host) reads as state `ended`."""
    d = Path(out) / RECORDS_DIR
    records = []
    here = socket.gethostname()
    for p in sorted(d.glob("worker-*.json")) if d.is_dir() else []:
        try:
            r = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(r, dict):
            continue
        r["file"] = p.name
        if r.get("state") == "profiling" and r.get("host") == here and not pid_alive(int(r.get("pid") or -1)):
            r["state"] = "ended"
        records.append(r)
    records.sort(key=lambda r: (str(r.get("started_at")), r.get("rank") or 0, r["file"]))
    return records
