"""One measuring process of `sift bench store` (run as `python -m sift_cli.lab.bench.store_probe`), so that its
imports, memory and page faults are its own: it opens a shard set, times requests of random ids and prints one
JSON object.

- `--path store` (the serving store): imports, open, the first request; `--warm` requests after the store's
  files were read once (in the page cache, as a hot set's are) and as many requests untimed; `--cold` requests,
  each after closing the store and dropping every file of the set from the page cache (`posix_fadvise(DONTNEED)`,
  where the OS honours it), from a freshly opened store;
- `--path parquet` (the Parquet reader, `shards.reader.ShardSet`): open and `--warm` requests.
Memory is the process's resident set (VmRSS) after opening and after the requests; bytes read are the store's own
count (tables once per bucket, then records) and, for cold requests, major page faults × the page size (the
table pages read from disk; records come by `pread`, which faults nothing).
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
from pathlib import Path  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def drop_from_page_cache(directory: Path) -> int:
    """Ask the OS to drop every file of the set from the page cache; returns how many files were advised."""
    n = 0
    for p in list(directory.glob("*.parquet")) + list((directory / "store").glob("*")):
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        except (AttributeError, OSError):
            pass
        finally:
            os.close(fd)
    return n


def read_into_page_cache(directory: Path) -> int:
    """Read every store file once (what a server's first hours do to a hot set): bytes read."""
    n = 0
    for p in sorted((directory / "store").glob("*")):
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                n += len(chunk)
    return n


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def doc_id(i: int) -> str:
    """The id of synthetic document i (`store_sets`)."""
    return f"doc{i:07d}"


def requests(n_docs: int, per_request: int, count: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[doc_id(rng.randrange(n_docs)) for _ in range(per_request)] for _ in range(count)]


def probe_store(directory: Path, n_docs: int, per_request: int, warm: int, cold: int, seed: int) -> dict:
    t0 = time.perf_counter()
    from ...store.bitstore import BitStore
    imported = time.perf_counter()
    store = BitStore(directory)
    opened = time.perf_counter()
    rss_open = rss_mib()
    reqs = requests(n_docs, per_request, 1 + 2 * warm + cold, seed)
    store.bits(reqs[0])
    first = time.perf_counter()
    out = {"path": "store", "import_ms": (imported - t0) * 1e3, "open_ms": (opened - imported) * 1e3,
           "first_request_ms": (first - opened) * 1e3, "process_to_first_request_ms": (first - T_START) * 1e3,
           "rss_mib_after_open": rss_open}
    if warm:
        out["prefetched_bytes"] = read_into_page_cache(directory)
    for r in reqs[1: 1 + warm]:
        store.bits(r)
    times, read = [], []
    for r in reqs[1 + warm: 1 + 2 * warm]:
        before = store.stats.bytes_read
        t = time.perf_counter()
        store.bits(r)
        times.append((time.perf_counter() - t) * 1e3)
        read.append(store.stats.bytes_read - before)
    out.update(warm_p50_ms=percentile(times, 0.5), warm_p99_ms=percentile(times, 0.99),
               warm_bytes_per_request=percentile(read, 0.5), rss_mib_after_requests=rss_mib(),
               buckets_mapped=len(store._buckets), buckets=store.num_shards)
    store.close()
    cold_times, cold_read, faults, advised = [], [], [], 0
    page = os.sysconf("SC_PAGE_SIZE")
    for r in reqs[1 + 2 * warm:]:
        store = None
        advised = drop_from_page_cache(directory)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        t = time.perf_counter()
        store = BitStore(directory)
        store.bits(r)
        cold_times.append((time.perf_counter() - t) * 1e3)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_majflt - f0)
        cold_read.append(store.stats.bytes_read)
    if cold_times:
        out.update(cold_p50_ms=percentile(cold_times, 0.5), cold_p99_ms=percentile(cold_times, 0.99),
                   cold_bytes_per_request=percentile(cold_read, 0.5),
                   cold_major_faults_bytes=percentile([f * page for f in faults], 0.5), files_advised=advised)
    return out


def probe_parquet(directory: Path, n_docs: int, per_request: int, warm: int, seed: int) -> dict:
    t0 = time.perf_counter()
    from ...shards.reader import ShardSet
    imported = time.perf_counter()
    shards = ShardSet(directory)
    opened = time.perf_counter()
    rss_open = rss_mib()
    times = []
    for r in requests(n_docs, per_request, warm, seed):
        t = time.perf_counter()
        shards.bits(r)
        times.append((time.perf_counter() - t) * 1e3)
    return {"path": "parquet", "import_ms": (imported - t0) * 1e3, "open_ms": (opened - imported) * 1e3,
            "process_to_first_request_ms": (opened - T_START) * 1e3 + (times[0] if times else 0.0),
            "warm_p50_ms": percentile(times, 0.5), "warm_p99_ms": percentile(times, 0.99),
            "rss_mib_after_open": rss_open, "rss_mib_after_requests": rss_mib()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("directory", type=Path)
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--path", choices=("store", "parquet"), default="store")
    ap.add_argument("--ids", type=int, default=20)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--cold", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.path == "store":
        result = probe_store(a.directory, a.docs, a.ids, a.warm, a.cold, a.seed)
    else:
        result = probe_parquet(a.directory, a.docs, a.ids, a.warm, a.seed)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
