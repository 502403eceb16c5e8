"""Worker start-up: the compile caches children share, a launcher that imports no torch, start-up phases in
reports, and the worker records that `sift status` shows. (The converted-weights cache: tests/test_cache.py.)"""

import json
import os
import subprocess
import sys
import time

import pytest

from sift_cli.launch.records import RECORDS_DIR, read_worker_records
from sift_cli.launch.startup import StartupClock
from sift_cli.profile.job import profile_corpus

from .workers import CFG, ROOT, assert_same_shards, common_args, worker


def test_children_share_the_compile_caches_unless_set(tmp_path):
    from sift_cli.cache import compile_cache_env
    from sift_cli.launch.local import worker_env

    env = {"SIFT_CACHE_DIR": str(tmp_path), "RANK": "3", "CUPY_CACHE_DIR": "/mine"}
    child = worker_env(env, "1")
    assert child["TRITON_CACHE_DIR"] == str(tmp_path / "triton") and child["CUPY_CACHE_DIR"] == "/mine"
    assert child["CUDA_VISIBLE_DEVICES"] == "1" and "RANK" not in child
    assert compile_cache_env(child) == {}


def test_the_launcher_imports_no_torch():
    code = ("import sys, os\n"
            "import sift_cli.cli.profile\n"
            "from sift_cli.launch.local import profile_with_local_workers, visible_gpus\n"
            "os.environ['CUDA_VISIBLE_DEVICES'] = '3,5,-1,7'\n"
            "print(visible_gpus(2, 'cuda'), visible_gpus(2, 'cpu'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "['3', '5'] [None, None] False"


def test_visible_gpus_counts_only_what_cuda_would(monkeypatch):
    from sift_cli.errors import SiftError
    from sift_cli.launch.local import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(SiftError, match="only 2 CUDA devices"):
        visible_gpus(3, "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SiftError, match="no CUDA GPU is visible"):
        visible_gpus(1, "auto")


def test_startup_phases_add_up():
    clock = StartupClock()  # not from the process start: only what happens from here
    with clock.phase("model"):
        time.sleep(0.02)
    time.sleep(0.01)
    s = clock.finish()
    assert s["since"] == "worker start" and set(s["phases"]) == {"model", "other"}
    assert s["phases"]["model"] >= 0.02 and abs(sum(s["phases"].values()) - s["seconds"]) < 0.002


@pytest.mark.slow
def test_worker_reports_startup_and_leaves_records_across_resume(tmp_path, tiny_lm, tiny_ckpt, small_corpus):
    """In-process workers: start-up phases in the report, a warm-up batch that changes no bit, one record per
    worker run (a resume adds its own), listed by `sift status`."""
    from sift_cli.launch.worker import ProfileWorker
    from sift_cli.shards.status import shard_status

    clean, out = tmp_path / "clean", tmp_path / "o"
    profile_corpus(small_corpus, clean, tiny_lm, CFG, num_shards=4)
    flags = {"tile": CFG.tile, "batch_tokens": CFG.batch_tokens}
    first = ProfileWorker.start(small_corpus, out, model=str(tiny_ckpt), device="cpu", flags=flags, num_shards=4,
                                rank=0, world_size=2, warmup=True)
    assert first.startup["since"] == "worker start"
    assert {"model", "tokenizer", "to_device", "config", "warmup"} <= set(first.startup["phases"])
    rep = first.run()
    assert rep.startup == first.startup and rep.to_json()["startup"] == first.startup
    assert sorted(rep.written) == [0, 2] and set(rep.to_json()["prepare"]) == {"read_corpus", "tokenize"}
    second = ProfileWorker.start(small_corpus, out, model=str(tiny_ckpt), device="cpu", flags=flags)  # a resume
    assert "warmup" not in second.startup["phases"]  # on CPU only when asked
    assert sorted(second.run().written) == [1, 3]
    assert_same_shards(clean, out)  # the warm-up changed nothing

    records = read_worker_records(out)
    assert len(records) == 2 == len(list((out / RECORDS_DIR).iterdir()))
    assert [(r["rank"], r["world_size"], r["state"], sorted(r["shards_written"])) for r in records] == \
        [(0, 2, "finished", [0, 2]), (0, 1, "finished", [1, 3])]
    assert records[0]["startup"] == first.startup and records[0]["device"] == "cpu"
    assert shard_status(out)["workers"] == records


@pytest.mark.slow
def test_cli_worker_start_up_from_process_start_in_json_and_status(tmp_path, tiny_ckpt, small_corpus):
    out = tmp_path / "o"
    code, stdout, stderr = worker(tmp_path, common_args(small_corpus, out, tiny_ckpt))
    assert code == 0, stderr
    st = json.loads(stdout)["startup"]
    assert st["since"] == "process start"
    assert {"python", "import_torch", "import_transformers", "model"} <= set(st["phases"])
    assert abs(sum(st["phases"].values()) - st["seconds"]) < 0.01
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    status = subprocess.run([sys.executable, "-m", "sift_cli.cli", "status", str(out), "--json"],
                            capture_output=True, text=True, env=env)
    [rec] = json.loads(status.stdout)["workers"]
    assert rec["startup"] == st and rec["state"] == "finished" and len(rec["shards_written"]) == 4
    human = subprocess.run([sys.executable, "-m", "sift_cli.cli", "status", str(out)], capture_output=True,
                           text=True, env=env)
    assert "1 worker run; start-up" in human.stdout and "rank 0/1" in human.stdout, human.stdout
