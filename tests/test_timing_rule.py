"""The one timing rule for a printed speed-up (`sift_cli.timing`): the warm median, or no speed-up."""

import json
import re

import torch

from sift_cli.prefill.assemble import assemble
from sift_cli.prefill.options import PrefillOptions, timing_defaults, with_device_defaults
from sift_cli.prefill.report import run_prefill
from sift_cli.timing import CPU_WARM_MEDIAN_TOKENS, timing_protocol

from .cli.test_cli import run
from .test_prefill import all_bits  # noqa: F401 (a fixture)


def test_the_rule():
    assert timing_protocol(3, 1) == {"protocol": "warm_median", "repeat": 3, "warmup": 1, "speedup_withheld": None}
    cold = timing_protocol(1, 0)
    assert cold["protocol"] == "single_cold_run" and "--warmup 1 --repeat 3" in cold["speedup_withheld"]
    for repeat, warmup in ((2, 1), (5, 0), (1, 2)):
        assert timing_protocol(repeat, warmup)["protocol"] == "too_few_runs"


def test_defaults_follow_the_device_and_the_prompt_length():
    assert timing_defaults("cuda:0") == {"repeat": 3, "warmup": 1}
    assert timing_defaults("cuda:0", 100_000) == {"repeat": 3, "warmup": 1}
    assert timing_defaults("cpu", CPU_WARM_MEDIAN_TOKENS) == {"repeat": 3, "warmup": 1}
    assert timing_defaults("cpu", CPU_WARM_MEDIAN_TOKENS + 1) == {"repeat": 1, "warmup": 0}
    assert timing_defaults("cpu") == {"repeat": 1, "warmup": 0}  # a prompt of unknown length
    cpu, long = torch.device("cpu"), CPU_WARM_MEDIAN_TOKENS + 1

    def resolved(**kw):
        o = with_device_defaults(PrefillOptions(**kw), cpu, long)
        return o.repeat, o.warmup

    assert resolved() == (1, 0)
    assert resolved(repeat=3) == (3, 1) and resolved(warmup=1) == (3, 1)  # one set alone meets the rule
    assert resolved(repeat=1) == (1, 0) and resolved(repeat=5, warmup=0) == (5, 0)
    gpu = with_device_defaults(PrefillOptions(repeat=1), torch.device("cuda"), 10)
    assert (gpu.repeat, gpu.warmup) == (1, 1)  # a GPU keeps its warm-up


def test_a_single_cold_run_reports_no_speedup(tiny_lm, all_bits):
    prompt = assemble(all_bits, tiny_lm, ["doc01", "doc02"], "What jumps?")
    calls = []
    r = run_prefill(tiny_lm, prompt, PrefillOptions(backend="gather", repeat=1, warmup=0, max_new_tokens=1),
                    progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 2), (2, 2)] and r["speedup"] is None
    assert r["timing"]["protocol"] == "single_cold_run" and r["timing"]["speedup_withheld"]
    assert r["dense"]["ttft_ms"] > 0 and r["sift"]["ttft_ms"] > 0  # the times are still there


def test_a_short_prompt_on_a_cpu_takes_the_warm_median(tiny_lm, all_bits):
    prompt = assemble(all_bits, tiny_lm, ["doc01", "doc02"], "What jumps?")
    assert len(prompt.input_ids) <= CPU_WARM_MEDIAN_TOKENS
    calls = []
    r = run_prefill(tiny_lm, prompt, PrefillOptions(backend="gather", max_new_tokens=1),
                    progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (8, 8) and len(r["dense"]["runs_ms"]) == 3  # a warm-up and 3 timed runs of each mode
    assert r["timing"]["protocol"] == "warm_median" and r["speedup"] > 0


def test_the_cli_prints_no_speedup_from_a_cold_run(tmp_path, tiny_ckpt, all_bits, capsys):
    docs, query = tmp_path / "ids.txt", tmp_path / "q.txt"
    docs.write_text("doc03\ndoc05\n")
    query.write_text("What does the fox do?\n")
    args = ["prefill", "--shards", all_bits.dir, "--docs", docs, "--query", query, "--model", tiny_ckpt,
            "--backend", "gather", "--max-new-tokens", "1"]
    code, stdout, _ = run(capsys, *args, "--repeat", "1")
    assert code == 0 and not re.search(r"speed-up \d", stdout) and "no speed-up from one cold run" in stdout
    assert "--warmup 1 --repeat 3" in stdout
    code, stdout, _ = run(capsys, *args, "--repeat", "1", "--json")
    r = json.loads(stdout)
    assert r["speedup"] is None and r["timing"]["protocol"] == "single_cold_run"
    code, stdout, _ = run(capsys, *args, "--repeat", "3")
    assert code == 0 and re.search(r"speed-up \d", stdout) and "median of 3 runs after 1 warm-up)" in stdout
