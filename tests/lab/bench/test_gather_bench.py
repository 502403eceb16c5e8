"""`sift bench gather` on a tiny model: a row per prompt length with the cells computed, JSON saved, and no
speed-up from a single cold run (the timing rule)."""

import json

from sift_cli.lab.bench.gather import pick_documents

from ...cli.test_cli import assert_one_line_error, run
from ...test_prefill import all_bits  # noqa: F401 (a fixture)


def test_pick_documents():
    sizes = {"a": 100, "b": 50, "c": 70}
    assert pick_documents(sizes, 1) == ["a"] and pick_documents(sizes, 120) == ["a"]
    assert pick_documents(sizes, 130) == ["a", "b"]
    assert pick_documents(sizes, 10_000) == ["a", "b", "c"]
    assert pick_documents(sizes, 10_000, limit=200) == ["a", "b"]  # the context leaves 200 document tokens


def test_bench_gather_rows_and_json(tmp_path, tiny_ckpt, all_bits, capsys):  # noqa: F811
    save = tmp_path / "gather.json"
    args = ["bench", "gather", "--shards", all_bits.dir, "--model", tiny_ckpt, "--lengths", "40,700,100000"]
    code, stdout, _ = run(capsys, *args, "--repeat", "1", "--warmup", "0", "--save", save)
    assert code == 0 and "no speed-up from one cold run" in stdout
    res = json.loads(save.read_text())
    rows = res["rows"]
    assert res["timing"]["protocol"] == "single_cold_run" and len(rows) == 3
    assert res["kind"] == "bench-gather" and res["command"].startswith("sift bench gather") and res["commit"]
    assert rows[0]["docs"] == 1 < rows[1]["docs"] and rows[0]["tokens"] < rows[1]["tokens"] <= 1024
    assert "more than the model's context" in rows[2]["error"]  # a length the model cannot take: said in its row
    for r in rows[:2]:
        assert r["speedup"] is None and 0 < r["cells"] <= 1 and r["full_ms"] > 0 and r["sift_ms"] > 0
    code, stdout, _ = run(capsys, *args[:-2], "--lengths", "60", "--repeat", "3", "--json")
    res = json.loads(stdout)
    assert res["timing"]["protocol"] == "warm_median" and res["rows"][0]["speedup"] > 0
    assert len(res["rows"][0]["sift_runs_ms"]) == 3


def test_bench_gather_bad_lengths(capsys, tmp_path):
    code, _, err = run(capsys, "bench", "gather", "--shards", tmp_path, "--lengths", "2k")
    assert_one_line_error(code, err, "--lengths")
