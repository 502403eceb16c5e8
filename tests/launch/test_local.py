"""`--gpus N` (as CPU processes here): local worker processes, failed workers, the shard count they share."""

import json

import pytest

from sift_cli.launch.records import read_worker_records
from sift_cli.profile.job import profile_corpus

from .workers import CFG, assert_same_shards, worker


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
    # each worker's start-up, from its process start, and the launcher's own (no torch, no model)
    for w in rep["per_worker"]:
        assert w["startup"]["since"] == "process start" and "import_transformers" in w["startup"]["phases"]
    assert rep["startup"]["worker_max_seconds"] == max(w["startup"]["seconds"] for w in rep["per_worker"])
    assert 0 < rep["startup"]["launcher_seconds"] < rep["startup"]["worker_max_seconds"]
    records = read_worker_records(out)
    assert sorted((r["rank"], r["world_size"], r["state"]) for r in records) == [(0, 2, "finished"), (1, 2, "finished")]
    assert sorted(s for r in records for s in r["shards_written"]) == [0, 1, 2, 3]

def test_launch_reports_failed_workers(tmp_path):
    import shutil

    from sift_cli.launch.local import launch_local, log_tail

    results = launch_local(["corpus", "--out", str(tmp_path)], 2, 4, "cpu", python=shutil.which("false"),
                           log_dir=tmp_path / "logs")
    assert [r.returncode for r in results] == [1, 1] and all(r.report is None for r in results)
    assert [r.log.name for r in results] == ["worker-0.log", "worker-1.log"] and log_tail(results[0].log) == ""

def test_shard_count_for_local_workers(tmp_path, tiny_lm, small_corpus):
    from sift_cli.corpus import CorpusFormat
    from sift_cli.launch.local import resolve_num_shards

    fmt = CorpusFormat()
    assert resolve_num_shards(small_corpus, fmt, tmp_path / "new", 7, 1000) == 7
    assert resolve_num_shards(small_corpus, fmt, tmp_path / "new", None, 5) == 3  # 12 documents, 5 per shard
    profile_corpus(small_corpus, tmp_path / "o", tiny_lm, CFG, num_shards=2, only_shards={0}, write_index=False)
    assert resolve_num_shards(small_corpus, fmt, tmp_path / "o", None, 5) == 2  # what the directory holds
