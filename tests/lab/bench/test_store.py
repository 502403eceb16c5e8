"""`sift bench store` and `sift bench prefill --corpus-docs` on small sets: every measurement present, and the
lookup inside SIFT's timed prefill. (The speed targets are the bench's, on sets of 10⁴–10⁶ documents.)"""

import glob
import json
import tempfile

from sift_cli.lab.bench.store import run_store_bench

from ...cli.test_cli import run


def test_store_bench_measures_both_read_paths_and_the_scans(tmp_path):
    r = run_store_bench(sizes=(400,), work_dir=tmp_path, docs_per_shard=100, lengths=(10, 200), warm=20, cold=2,
                        parquet_requests=2, log=lambda *a: None)
    row = r["rows"][0]
    store, parquet = row["store"], row["parquet"]
    assert "error" not in store and "error" not in parquet
    assert store["warm_p50_ms"] > 0 and store["cold_p50_ms"] > 0 and store["new_process_ms"] > 0
    assert 0 < store["warm_bytes_per_request"] < row["store_bytes"] / 2 and store["buckets_mapped"] == 4
    assert [s["exit"] for s in row["scans"]] == [0, 0, 0, 0]
    again = run_store_bench(sizes=(400,), work_dir=tmp_path, docs_per_shard=100, lengths=(10, 200), warm=2, cold=0,
                            parquet_requests=1, scans=False, log=lambda *a: None)
    assert again["rows"][0]["built_seconds"] is None  # the set in a given work dir is reused


def test_prefill_bench_looks_the_bits_up_inside_sift_time(capsys):
    before = set(glob.glob(f"{tempfile.gettempdir()}/sift-bench-corpus-*"))
    code, stdout, _ = run(capsys, "bench", "prefill", "--cpu-smoke", "--models", "llama3-8b", "--lengths", "512",
                          "--corpus-docs", "200", "--modes", "full,sift", "--no-energy", "--repeat", "1", "--json")
    rows = {r["mode"]: r for r in json.loads(stdout)["rows"]}
    assert code == 0 and "200-document set" in rows["sift-gather"]["pattern"]
    assert 0 < rows["sift-gather"]["lookup_ms"] < rows["sift-gather"]["ttft_ms"]
    assert set(glob.glob(f"{tempfile.gettempdir()}/sift-bench-corpus-*")) == before  # its own set, removed
