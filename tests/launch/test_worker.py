"""Workers: 1 vs 3 in-process workers, a worker process killed mid-shard and resumed, two workers with the same
rank at once, and a worker of several without a fixed shard count."""

import json
import signal
import sys

import pytest

from sift_cli.launch.claims import busy_buckets
from sift_cli.launch.ranks import owned_shards
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.files import list_parts
from sift_cli.shards.format import MANIFEST
from sift_cli.shards.validate import validate_path

from .workers import CFG, assert_same_shards, common_args, leftovers, rows_by_doc, worker


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
