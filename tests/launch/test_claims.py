"""Per-bucket claims: one holder at a time, the O_EXCL fallback with stale locks, leftovers of dead writers."""

import json
import os
import subprocess
import sys
import time

from sift_cli.launch.claims import BucketClaims, busy_buckets, clean_leftovers, lock_path, remove_tmp_files
from sift_cli.profile.job import profile_corpus

from .workers import CFG, leftovers


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
