"""What the launcher tests share: comparing shard directories, and running `sift profile` in a separate process
that can be slowed down or killed in the middle of writing a shard."""

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from sift_cli.config import ProfileConfig
from sift_cli.launch.records import RECORDS_DIR
from sift_cli.shards.files import list_parts

CFG = ProfileConfig(tile=16, batch_tokens=2048)
ROOT = Path(__file__).resolve().parent.parent.parent


def shard_files(d: Path) -> list[str]:
    return sorted(p.name for p in list_parts(d))

def assert_same_shards(a: Path, b: Path):
    assert shard_files(a) == shard_files(b)
    for name in shard_files(a):
        assert filecmp.cmp(a / name, b / name, shallow=False), name

def rows_by_doc(d: Path) -> dict:
    out = {}
    for p in list_parts(d):
        for r in pq.read_table(p).to_pylist():
            assert r["doc_id"] not in out, f"duplicate {r['doc_id']}"
            out[r["doc_id"]] = r
    return out

def leftovers(d: Path) -> list[str]:
    """Hidden files a run left: locks, temporaries (not the worker records, which are kept on purpose)."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".") and p.name != RECORDS_DIR)


DRIVER = r"""
import os, signal, sys, time
import sift_cli.profile.job as job
import sift_cli.shards.files as shards

slow = float(os.environ.get("SIFT_TEST_SLOW", "0"))
if slow:
    real_batch = job.launch_profile_batch
    def slow_batch(*a, **k):
        time.sleep(slow)
        return real_batch(*a, **k)
    job.launch_profile_batch = slow_batch

kill_at = int(os.environ.get("SIFT_TEST_KILL_AT_SHARD", "0"))
if kill_at:
    real_write = shards.pq.write_table
    calls = {"n": 0}
    def dying_write(table, where, **kw):
        calls["n"] += 1
        if calls["n"] == kill_at:
            with open(where, "wb") as f:
                f.write(b"PAR1 half a shard")
                f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write(table, where, **kw)
    shards.pq.write_table = dying_write

from sift_cli.cli import main
sys.argv = ["sift", "profile"] + sys.argv[1:]
main()
"""


def worker(tmp_path, args, env=None, wait=True):
    e = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    e.pop("TRITON_INTERPRET", None)
    p = subprocess.Popen([sys.executable, "-c", DRIVER, *map(str, args)], env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    stdout, stderr = p.communicate(timeout=300)
    return p.returncode, stdout, stderr

def common_args(corpus, out, ckpt, *more):
    return [corpus, "--out", out, "--model", ckpt, "--device", "cpu", "--tile", 16, "--batch-tokens", 2048,
            "--num-shards", 4, "--json", *more]
