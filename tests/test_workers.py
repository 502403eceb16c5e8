"""Profiling as many workers: rank detection, bucket ownership, 1 vs 3 workers, SIGKILL and resume, two workers
with the same rank at once, `--gpus N` (as CPU processes here), `sift status` while workers run."""

import filecmp
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sift_cli.errors import SiftError
from sift_cli.profile.job import profile_corpus
from sift_cli.config import ProfileConfig
from sift_cli.shards import MANIFEST, list_parts, part_name
from sift_cli.validate import validate_path
from sift_cli.workers import (BucketClaims, busy_buckets, clean_leftovers, detect_rank, lock_path, owned_shards,
                              remove_tmp_files)

CFG = ProfileConfig(tile=16, batch_tokens=2048)
ROOT = Path(__file__).resolve().parent.parent


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
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


# ---- rank detection -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env,expected", [
    ({}, (0, 1, None, "single")),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8, 1, "torchrun")),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "10", "SLURM_ARRAY_TASK_MIN": "0"},
     (4, 10, None, "slurm-array")),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_STEP": "2"}, (3, 4, None, "slurm-array")),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "2",
      "SLURM_NTASKS": "4"}, (2, 4, 2, "slurm-srun")),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_STEP_ID": "0",
      "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, (3, 6, 1, "slurm-array+srun")),
    # a batch script's own shell (no srun step) is one worker even in a 4-task allocation: nothing left out
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_ID": "1"}, (0, 1, None, "single")),
    # torchrun wins over Slurm (torchrun started inside an allocation)
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "9"},
     (1, 2, None, "torchrun")),
])
def test_rank_from_environment(env, expected):
    w = detect_rank(env=env)
    assert (w.rank, w.world_size, w.local_rank, w.source) == expected


def test_rank_flags_win_and_are_checked():
    w = detect_rank(2, 3, env={"RANK": "0", "WORLD_SIZE": "8"})
    assert (w.rank, w.world_size, w.source) == (2, 3, "flags")
    for bad in ((3, 3), (-1, 2), (0, 0)):
        with pytest.raises(SiftError, match="rank"):
            detect_rank(*bad, env={})
    with pytest.raises(SiftError, match="go together"):
        detect_rank(1, None, env={})
    with pytest.raises(SiftError, match="does not map"):
        detect_rank(env={"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
                         "SLURM_ARRAY_TASK_STEP": "2"})
    with pytest.raises(SiftError, match="not an integer"):
        detect_rank(env={"RANK": "x", "WORLD_SIZE": "2"})


def test_owned_shards_partition_the_buckets():
    parts = [owned_shards(10, r, 3) for r in range(3)]
    assert set().union(*parts) == set(range(10)) and sum(map(len, parts)) == 10
    assert parts[1] == {1, 4, 7}


# ---- in-process workers ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_one_worker_and_three_workers_give_identical_shards(tmp_path, tiny_lm, small_corpus):
    one, three = tmp_path / "one", tmp_path / "three"
    profile_corpus(small_corpus, one, tiny_lm, CFG, num_shards=5)
    reports = [profile_corpus(small_corpus, three, tiny_lm, CFG, num_shards=5, only_shards=owned_shards(5, r, 3))
               for r in (2, 0, 1)]  # any order
    assert [r.manifest is not None for r in reports] == [False, False, True]  # the last one to finish indexes
    assert sum(r.shards_written for r in reports) == 5
    assert_same_shards(one, three)
    a, b = rows_by_doc(one), rows_by_doc(three)
    assert a.keys() == b.keys() and len(a) == 12
    for doc_id in a:
        assert a[doc_id] == b[doc_id], doc_id
    assert validate_path(three)["ok"] and leftovers(three) == []


def test_claims_exclude_a_second_holder_and_wait(tmp_path):
    a, b = BucketClaims(tmp_path), BucketClaims(tmp_path)
    with a(3) as mine:
        assert mine and lock_path(tmp_path, 3).exists()
        assert busy_buckets(tmp_path) == [3]
        with b(3) as theirs:
            assert not theirs
        with b(4) as other:
            assert other
    assert not lock_path(tmp_path, 3).exists() and busy_buckets(tmp_path) == []
    with b(3, True) as mine:
        assert mine


def test_exclusive_file_fallback_and_stale_locks(tmp_path):
    a, b = BucketClaims(tmp_path), BucketClaims(tmp_path, stale_after=3600)
    a.use_flock = b.use_flock = False  # as on a file system without flock
    with a(1) as mine:
        assert mine and lock_path(tmp_path, 1, exclusive_file=True).exists()
        with b(1) as theirs:
            assert not theirs  # a live holder on this host
    assert not lock_path(tmp_path, 1, exclusive_file=True).exists()
    # a lock left by a process that is gone: broken at once
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_path(tmp_path, 2, exclusive_file=True).write_text(json.dumps(
        {"host": b.owner["host"], "pid": int(dead.stdout), "nonce": "x"}))
    with b(2) as mine:
        assert mine
    # another host's lock is honoured until its heartbeat is older than stale_after
    p = lock_path(tmp_path, 5, exclusive_file=True)
    p.write_text(json.dumps({"host": "elsewhere", "pid": 1, "nonce": "y"}))
    with b(5) as mine:
        assert not mine
    os.utime(p, (time.time() - 7200, time.time() - 7200))
    with b(5) as mine:
        assert mine


def test_claim_removes_a_dead_writers_temporaries(tmp_path):
    tmp = tmp_path / ".part-00002.parquet.abc123.tmp"
    tmp.write_bytes(b"PAR1 half")
    (tmp_path / ".part-00003.parquet.def.tmp").write_bytes(b"x")
    with BucketClaims(tmp_path)(2) as mine:
        assert mine and not tmp.exists()
    assert remove_tmp_files(tmp_path, 3) == 1


# ---- worker processes -----------------------------------------------------------------------------------------

DRIVER = r"""
import os, signal, sys, time
import sift_cli.profile.job as job
import sift_cli.shards as shards

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


@pytest.mark.slow
def test_worker_killed_mid_shard_resumes_with_nothing_lost_or_duplicated(tmp_path, tiny_lm, tiny_ckpt,
                                                                          small_corpus):
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    profile_corpus(small_corpus, clean, tiny_lm, CFG, num_shards=4)
    code, _, _ = worker(tmp_path, common_args(small_corpus, crashed, tiny_ckpt),
                        env={"SIFT_TEST_KILL_AT_SHARD": "3"})
    assert code == -signal.SIGKILL
    assert len(list_parts(crashed)) == 2 and not (crashed / MANIFEST).exists()
    assert any(n.endswith(".tmp") for n in leftovers(crashed))  # the half-written shard it died in
    assert any(n.endswith(".lock") for n in leftovers(crashed)) and busy_buckets(crashed) == []  # not held
    rep = profile_corpus(small_corpus, crashed, tiny_lm, CFG)
    assert rep.shards_reused == 2 and rep.shards_written == 2 and rep.manifest
    assert_same_shards(clean, crashed)
    assert rows_by_doc(crashed).keys() == rows_by_doc(clean).keys()
    assert leftovers(crashed) == [] and validate_path(crashed)["ok"]


@pytest.mark.slow
def test_two_workers_with_the_same_rank_do_not_corrupt_output(tmp_path, tiny_lm, tiny_ckpt, small_corpus):
    clean, out = tmp_path / "clean", tmp_path / "same-rank"
    profile_corpus(small_corpus, clean, tiny_lm, CFG, num_shards=4)
    args = common_args(small_corpus, out, tiny_ckpt, "--rank", 0, "--world-size", 1)
    procs = [worker(tmp_path, args, env={"SIFT_TEST_SLOW": "0.4"}, wait=False) for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    for stdout, stderr, code in results:
        assert code == 0, stderr
    reports = [json.loads(stdout) for stdout, _, _ in results]
    assert sum(r["shards_written"] for r in reports) == 4  # each shard written once, by one of them
    assert all(r["shards_written"] + r["shards_reused"] == 4 for r in reports)
    assert_same_shards(clean, out)
    assert leftovers(out) == [] and validate_path(out)["ok"]


@pytest.mark.slow
def test_status_shows_shards_in_progress_and_finalize_cleans_up(tmp_path, tiny_lm, small_corpus, capsys):
    from sift_cli.cli import main

    out = tmp_path / "o"
    profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=4, only_shards={0, 1}, write_index=False)

    def status(*extra):
        old, sys.argv = sys.argv, ["sift", "status", str(out), "--json", *extra]
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        finally:
            sys.argv = old
        return code, capsys.readouterr()

    with BucketClaims(out)(2) as mine:
        assert mine
        code, cap = status()
        assert json.loads(cap.out)["running"] == [2] and json.loads(cap.out)["missing"] == [2, 3]
    (out / ".part-00003.parquet.zz.tmp").write_bytes(b"junk")
    profile_corpus(small_corpus, out, tiny_lm, CFG, only_shards={2, 3}, write_index=False)
    (out / ".part-00001.lock").write_text("{}")  # a lock file a killed worker left
    code, cap = status("--finalize")
    assert code == 0 and json.loads(cap.out)["manifest"]
    assert leftovers(out) == [] and validate_path(out)["ok"]


@pytest.mark.slow
def test_gpus_flag_launches_local_workers(tmp_path, tiny_lm, tiny_ckpt, small_corpus):
    """`--gpus 2` with --device cpu: two worker processes of the same command; same shards as one process."""
    clean, out = tmp_path / "clean", tmp_path / "two"
    profile_corpus(small_corpus, clean, tiny_lm, CFG, num_shards=4)
    args = [small_corpus, "--out", out, "--model", tiny_ckpt, "--device", "cpu", "--tile", 16, "--batch-tokens",
            2048, "--num-shards", 4, "--gpus", 2, "--json"]
    code, stdout, stderr = worker(tmp_path, args)
    assert code == 0, stderr
    rep = json.loads(stdout)
    assert rep["workers"] == 2 and rep["num_shards"] == 4 and rep["profiled"] == 12 and rep["manifest"]
    assert sorted(w["rank"] for w in rep["per_worker"]) == [0, 1]
    assert_same_shards(clean, out)


def test_launch_reports_failed_workers(tmp_path):
    import shutil

    from sift_cli.workers import launch_local, log_tail

    results = launch_local(["corpus", "--out", str(tmp_path)], 2, 4, "cpu", python=shutil.which("false"),
                           log_dir=tmp_path / "logs")
    assert [r.returncode for r in results] == [1, 1] and all(r.report is None for r in results)
    assert [r.log.name for r in results] == ["worker-0.log", "worker-1.log"] and log_tail(results[0].log) == ""


def test_several_workers_need_a_fixed_shard_count(tmp_path, tiny_ckpt, small_corpus, capsys):
    from sift_cli.cli import main

    old, sys.argv = sys.argv, ["sift", "profile", str(small_corpus), "--out", str(tmp_path / "o"), "--model",
                               str(tiny_ckpt), "--device", "cpu", "--rank", "1", "--world-size", "3"]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = old
    assert exc.value.code == 2 and "pass --num-shards" in capsys.readouterr().err


def test_shard_count_for_local_workers(tmp_path, tiny_lm, small_corpus):
    from sift_cli.corpus import CorpusFormat
    from sift_cli.workers import resolve_num_shards

    fmt = CorpusFormat()
    assert resolve_num_shards(small_corpus, fmt, tmp_path / "new", 7, 1000) == 7
    assert resolve_num_shards(small_corpus, fmt, tmp_path / "new", None, 5) == 3  # 12 documents, 5 per shard
    profile_corpus(small_corpus, tmp_path / "o", tiny_lm, CFG, num_shards=2, only_shards={0}, write_index=False)
    assert resolve_num_shards(small_corpus, fmt, tmp_path / "o", None, 5) == 2  # what the directory holds


def test_clean_leftovers_keeps_held_locks(tmp_path):
    (tmp_path / ".part-00004.lock").write_text("{}")
    (tmp_path / ".part-00004.parquet.q.tmp").write_text("x")
    with BucketClaims(tmp_path)(7) as mine:
        assert mine
        assert clean_leftovers(tmp_path) == 2
        assert leftovers(tmp_path) == [".part-00007.lock"]


def test_claim_is_held_until_the_shard_file_is_in_place(tmp_path, tiny_lm, small_corpus, monkeypatch):
    """Shards are written on a background thread; the bucket stays claimed until its file is renamed in place."""
    import sift_cli.profile.job as jobmod

    real_write, seen = jobmod.write_shard, []

    def checking_write(path, rows, meta):
        seen.append((meta["sift.shard_index"], busy_buckets(path.parent)))
        real_write(path, rows, meta)

    monkeypatch.setattr(jobmod, "write_shard", checking_write)
    profile_corpus(small_corpus, tmp_path / "o", tiny_lm, CFG, num_shards=3)
    assert sorted(s for s, _ in seen) == [0, 1, 2]
    assert all(s in busy for s, busy in seen)
    assert busy_buckets(tmp_path / "o") == [] and leftovers(tmp_path / "o") == []
