"""`sift bench store`: fetching a prompt's bits from shard sets of 10⁴–10⁶ documents, the serving store beside
the Parquet reader, and the full scans (`validate`, `inspect`, `ids --json`, `status --finalize`) at that scale.

Sets are written through the project's own writer (`store_sets.build_synthetic_set`: random tokens and valid
bits at about the paper's densities, documents of 100–1,500 tokens by default, 1,000 per part file) into
`work_dir`, and reused when a finished one is there. Every measurement runs in a process of its own
(`store_probe` for lookups, the `sift` CLI for the scans), so imports, memory and page faults are its own; a scan's
peak memory is the largest resident set of its process and that process's workers (VmHWM, read from /proc while
they run; `wait4`'s ru_maxrss would start from this process's own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.table import Table

from ...errors import SiftError
from ...store.layout import SET_FILE, STORE_DIR
from .store_sets import SHAPES, build_synthetic_set

SCANS = {"validate": ["validate", "{dir}"], "inspect": ["inspect", "{dir}"], "ids --json": ["ids", "{dir}", "--json"],
         "status --finalize": ["status", "{dir}", "--finalize"]}
_ROOT = Path(__file__).resolve().parents[3]
PROTOCOL = ("each measurement in a process of its own; requests of {ids} random ids; warm: {warm} timed after as "
            "many untimed, the set's store files read into the page cache first; cold: {cold} each after dropping "
            "the set from the page cache and reopening the store; scans: wall time and peak RSS of the `sift` "
            "process")


def _env() -> dict:
    """The measuring processes import this source tree (a checkout run with PYTHONPATH, or the installed one)."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{_ROOT}{os.pathsep}{path}" if path else str(_ROOT)}


def finished_set(directory: Path) -> bool:
    return (directory / STORE_DIR / SET_FILE).is_file() and (directory / "manifest.parquet").is_file()


def run_process(args: list[str], stdout_to_devnull: bool = False) -> tuple[int, float, float, str]:
    """(exit code, wall seconds, peak resident MiB, stdout) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL if stdout_to_devnull else subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(), text=True)
    hwm = [0]
    watcher = threading.Thread(target=_watch_hwm, args=(proc, hwm), daemon=True)
    watcher.start()
    out = "" if stdout_to_devnull else proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    watcher.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        out = out or err
    # ru_maxrss starts from this process's own peak (Linux carries it across fork and exec), so it only bounds the
    # child's from above; the VmHWM read while it runs is the child's own
    return proc.returncode, seconds, (hwm[0] or usage.ru_maxrss) / 1024, out


def _watch_hwm(proc: subprocess.Popen, hwm: list) -> None:
    """The largest peak resident set (VmHWM, KiB) of the child and its own children (a scan's worker processes),
    as read from /proc every 2 ms until the child is gone: what ru_maxrss would say without this process's part."""
    def peak(pid: int) -> int:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)

    def children(pid: int) -> list[int]:
        try:
            with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
                return [int(c) for c in f.read().split()]
        except OSError:
            return []

    while True:
        try:
            hwm[0] = max(hwm[0], peak(proc.pid))
        except (OSError, ValueError):
            return  # reaped: the last values read stand
        for child in children(proc.pid):
            try:
                hwm[0] = max(hwm[0], peak(child))
            except (OSError, ValueError):
                pass
        time.sleep(0.002)


def probe(directory: Path, n_docs: int, path: str, ids: int, warm: int, cold: int) -> dict:
    code, wall, peak, out = run_process([sys.executable, "-m", "sift_cli.lab.bench.store_probe", str(directory),
                                         "--docs", str(n_docs), "--path", path, "--ids", str(ids), "--warm",
                                         str(warm), "--cold", str(cold)])
    if code != 0:
        return {"path": path, "error": out.strip().splitlines()[-1] if out.strip() else f"exit {code}"}
    return {**json.loads(out), "process_wall_ms": wall * 1e3, "peak_rss_mib": peak}


def scan(directory: Path, name: str) -> dict:
    args = [sys.executable, "-m", "sift_cli"] + [a.format(dir=directory) for a in SCANS[name]]
    code, wall, peak, _ = run_process(args, stdout_to_devnull=True)
    return {"scan": name, "exit": code, "seconds": wall, "peak_rss_mib": peak}


def run_store_bench(sizes=(10_000, 100_000), shape: str = "smollm2", work_dir: str | Path | None = None,
                    docs_per_shard: int = 1000, lengths: tuple[int, int] = (100, 1500), ids: int = 20,
                    warm: int = 200, cold: int = 10, parquet_requests: int = 5, workers: int = 1,
                    scans: bool = True, log=print) -> dict:
    """Rows for each set size: the set (built or reused), the store's and the Parquet reader's lookups, the scans.
    A `work_dir` given is kept (its sets reused next time); without one, a temporary folder is removed at the end."""
    if shape not in SHAPES:
        raise SiftError(f"--shape {shape}: expected one of {', '.join(SHAPES)}")
    own = work_dir is None
    root = Path(tempfile.mkdtemp(prefix="sift-bench-store-")) if own else Path(work_dir)
    rows = []
    try:
        for n in sizes:
            d = root / f"{shape}-{n}-{docs_per_shard}-{lengths[0]}-{lengths[1]}"
            row = {"documents": n, "shape": SHAPES[shape].name, "docs_per_shard": docs_per_shard,
                   "lengths": list(lengths), "set": str(d)}
            if finished_set(d):
                row["built_seconds"] = None
            else:
                log(f"building a set of {n:,} documents in {d} ({workers} workers)")
                t0 = time.perf_counter()
                build_synthetic_set(d, n, shape, docs_per_shard, lengths, workers)
                row["built_seconds"] = time.perf_counter() - t0
            row["parquet_bytes"] = sum(p.stat().st_size for p in d.glob("*.parquet"))
            row["store_bytes"] = sum(p.stat().st_size for p in (d / STORE_DIR).glob("*"))
            for kind, requests in (("store", warm), ("parquet", parquet_requests)):
                log(f"  {n:,} documents: lookups through the {kind} reader")
                first = probe(d, n, kind, ids, 1 if kind == "parquet" else 0, 0)  # a new process's first request
                row[kind] = probe(d, n, kind, ids, requests, cold if kind == "store" else 0)
                row[kind]["new_process_ms"] = first.get("process_wall_ms")
            if scans:
                row["scans"] = []
                for name in SCANS:
                    log(f"  {n:,} documents: sift {name}")
                    row["scans"].append(scan(d, name))
            rows.append(row)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return {"rows": rows, "ids_per_request": ids, "warm_requests": warm, "cold_requests": cold,
            "protocol": PROTOCOL.format(ids=ids, warm=warm, cold=cold)}


def _ms(x) -> str:
    return "—" if x is None else (f"{x:.3f}" if x < 10 else f"{x:,.0f}")


def render(result: dict) -> list[Table]:
    k = result["ids_per_request"]
    t = Table(title=f"requests of {k} random ids (ms; warm: set open, its store files in the page cache; cold: every "
                    "file dropped from the page cache, store reopened)", show_edge=False)
    for col in ("documents", "read path", "open", "new process → 1st request", "warm p50", "warm p99", "cold p50",
                "cold p99", "bytes / request (warm, cold)", "RSS after open MiB", "peak RSS MiB"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        for kind in ("store", "parquet"):
            p = r[kind]
            if "error" in p:
                t.add_row(f"{r['documents']:,}", kind, f"error: {p['error']}")
                continue
            read = (f"{p['warm_bytes_per_request']:,.0f}, {p.get('cold_bytes_per_request') or 0:,.0f}"
                    if kind == "store" else "whole part files")
            t.add_row(f"{r['documents']:,}", kind, _ms(p["open_ms"]), _ms(p["new_process_ms"]),
                      _ms(p["warm_p50_ms"]), _ms(p["warm_p99_ms"]), _ms(p.get("cold_p50_ms")),
                      _ms(p.get("cold_p99_ms")), read, f"{p['rss_mib_after_open']:.0f}", f"{p['peak_rss_mib']:.0f}")
    tables = [t]
    if any(r.get("scans") for r in result["rows"]):
        s = Table(title="full scans (seconds, peak resident MiB)", show_edge=False)
        s.add_column("documents", justify="right")
        for name in SCANS:
            s.add_column(f"{name}", justify="right")
        for r in result["rows"]:
            cells = [f"{x['seconds']:.1f} s, {x['peak_rss_mib']:.0f} MiB" + ("" if x["exit"] == 0 else
                                                                             f" (exit {x['exit']})")
                     for x in r.get("scans", [])]
            s.add_row(f"{r['documents']:,}", *cells)
        tables.append(s)
    return tables
