"""Without a GPU or the evaluation data every benchmark and evaluation command stops with exit 2 and one line
(`error: <what> — <what to do>`), no traceback, nothing in table cells, before any long work."""

import pytest
import torch

import sift_cli.lab.datasets as datasets

from .test_cli import assert_one_line_error, run

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


@pytest.fixture
def no_data(tmp_path, monkeypatch):
    """No evaluation data anywhere sift looks for it."""
    monkeypatch.delenv("SIFT_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets, "_REPO", tmp_path / "repo")
    return tmp_path


@no_gpu
@pytest.mark.parametrize("args,fragment", [
    (["bench", "kernels", "--quick"], "CUDA GPU"),
    (["bench", "profile"], "no CUDA GPU"),
    (["bench", "profile", "--quick", "--cases", "8b-2k"], "no CUDA GPU"),
    (["bench", "prefill"], "no CUDA GPU"),
])
def test_bench_commands_without_a_gpu(capsys, no_data, args, fragment):
    code, out, err = run(capsys, *args)
    assert_one_line_error(code, err, fragment)
    assert code == 2 and out == ""


@pytest.mark.parametrize("args", [
    ["bench", "profile", "--device", "cpu", "--cases", "nq,essays"],
    ["eval", "recall", "--data", "nq"],
    ["eval", "sweep", "--data", "essays"],
    ["eval", "qa", "--nq"],
    ["eval", "build-qa", "--out", "x.jsonl"],
])
def test_commands_without_data(capsys, no_data, monkeypatch, args):
    import sift_cli.lab.runs as runs

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the data was looked for")

    monkeypatch.setattr(runs.ModelSpec, "load", no_model)
    monkeypatch.chdir(no_data)
    code, out, err = run(capsys, *args)
    assert_one_line_error(code, err, "evaluation data not found", " — ")
    assert code == 2 and out == ""


def test_a_failing_benchmark_case_is_listed_not_tabled(capsys, monkeypatch):
    import sift_cli.lab.bench.profile as bp

    monkeypatch.setattr(bp, "run_profile_bench", lambda **k: [{"model": "m", "case": "c", "error": "RuntimeError: boom"}])
    code, out, err = run(capsys, "bench", "profile", "--device", "cpu")
    assert code == 1 and "boom" not in out and "failed: m / c: RuntimeError: boom" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["96", "64,x", ""])
def test_bench_prefill_refuses_a_bad_query_block_size(capsys, value):
    """--block-m is checked before the GPU is looked for, with one line."""
    code, out, err = run(capsys, "bench", "prefill", "--block-m", value)
    assert_one_line_error(code, err, "--block-m")
    assert code == 2 and out == ""
