"""`sift eval …`, `sift calibrate`, `sift bench prefill` end to end on the tiny model (mounted as the CLI mounts
them)."""

import importlib.util
import json
import sys

import pytest
import torch
import typer

from sift_cli.cli.bench import bench_prefill
from sift_cli.cli.console import err
from sift_cli.cli.calibrate import calibrate
from sift_cli.cli.eval import eval_app
from sift_cli.errors import SiftError

from ..helpers import TRAINING_TEXT, command_line

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def plot_args(path):
    """`--plot PATH` where matplotlib is installed (the test extra installs it), nothing elsewhere."""
    return ["--plot", path] if HAVE_MATPLOTLIB else []


def assert_png(path):
    if HAVE_MATPLOTLIB:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path


def _app():
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.add_typer(eval_app, name="eval")
    app.command("calibrate")(calibrate)
    bench = typer.Typer()
    bench.command("prefill")(bench_prefill)
    bench.command("noop", hidden=True)(lambda: None)
    app.add_typer(bench, name="bench")
    return app


def run(capsys, *args):
    """Like cli.main: SiftError → one error line and its exit code."""
    code = 0
    try:
        with command_line(*args):
            rc = _app()(standalone_mode=False)
        code = rc if isinstance(rc, int) else 0
    except SiftError as exc:
        err.print(f"error: {exc}")
        code = exc.exit_code
    except typer.Exit as exc:
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code or 0
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture
def qa_file(tmp_path):
    recs = []
    for i in range(2):
        ctxs = [{"title": f"Doc {j}", "text": TRAINING_TEXT[(i + j) % 5], "isgold": j == 1} for j in range(3)]
        recs.append({"question": "What jumps over the lazy dog?", "answers": ["fox"], "ctxs": ctxs})
    p = tmp_path / "qa.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return p


def test_eval_qa_end_to_end_and_resume(capsys, tmp_path, tiny_ckpt, qa_file):
    results = tmp_path / "res.jsonl"
    args = ["eval", "qa", qa_file, "--model", tiny_ckpt, "--device", "cpu", "--n-docs", "2,3", "--tile", 16,
            "--max-new-tokens", 3, "--results", results, "--work", tmp_path / "w", "--json",
            *plot_args(tmp_path / "qa.png")]
    code, out, errs = run(capsys, *args)
    assert code == 0, errs
    assert_png(tmp_path / "qa.png")
    res = json.loads(out)
    assert [r["n_docs"] for r in res["runs"]] == [2, 3]
    s = res["runs"][1]["summary"]
    assert set(s) == {"full", "sift", "sink+window", "kv-reuse", "cacheblend", "noise_floor"}
    assert s["full"]["agreement_with_full"] == 1.0 and s["full"]["n"] == 2
    # beside the numeric noise; no cold per-shape timings
    assert s["noise_floor"]["reference_dtype"] == "bfloat16" and s["noise_floor"]["kl_median"] > 0
    assert s["sift"]["kl_over_noise_median"] >= 0 and "ttft_ms_median" not in s["sift"]
    assert 0 < s["sift"]["cell_density_mean"] <= 1
    assert len(results.read_text().splitlines()) == 4
    code, out2, _ = run(capsys, *args)  # resumed: nothing recomputed, same answers
    assert code == 0 and len(results.read_text().splitlines()) == 4
    assert json.loads(out2)["runs"][1]["summary"]["sift"] == s["sift"]
    code, out, _ = run(capsys, "eval", "qa", qa_file, "--model", tiny_ckpt, "--device", "cpu", "--n-docs", "2",
                       "--modes", "full,sift", "--max-new-tokens", 2, "--work", tmp_path / "w2")
    assert code == 0 and "accuracy" in out and "sift" in out and "noise floor" in out and "TTFT" not in out
    code, out, _ = run(capsys, "eval", "qa", qa_file, "--model", tiny_ckpt, "--device", "cpu", "--n-docs", "2",
                       "--modes", "full,sift", "--max-new-tokens", 2, "--rule", "mass", "--epsilon", "0.05",
                       "--tile", 16, "--no-noise-floor", "--json", "--work", tmp_path / "w3")
    res = json.loads(out)
    assert code == 0 and res["thresholds"]["rule"] == "mass" and "noise_floor" not in res["runs"][0]["summary"]


def test_eval_errors_are_one_line(capsys, tmp_path, tiny_ckpt, qa_file):
    code, _, e = run(capsys, "eval", "qa", "--model", tiny_ckpt)
    assert code == 2 and "records file" in e
    code, _, e = run(capsys, "eval", "qa", qa_file, "--model", tiny_ckpt, "--modes", "full,magic", "--work",
                     tmp_path / "w")
    assert code == 2 and "unknown mode" in e
    code, _, e = run(capsys, "eval", "qa", qa_file, "--model", tiny_ckpt, "--epsilon", "0.1")
    assert code == 2 and "--epsilon belongs to --rule mass" in e
    code, _, e = run(capsys, "eval", "recall", "--model", tiny_ckpt)
    assert code == 2 and "--shards" in e
    code, _, e = run(capsys, "eval", "storage", "--models", "GPT-9")
    assert code == 2 and "unknown" in e
    code, _, e = run(capsys, "calibrate", qa_file, "--model", tiny_ckpt)
    assert code == 2 and "target" in e


def test_eval_storage_json(capsys, tmp_path):
    code, out, _ = run(capsys, "eval", "storage", "--models", "Llama-3-8B,Qwen3-235B-A22B", "--tile", 128, "--json")
    res = json.loads(out)
    assert code == 0 and {r["model"] for r in res["models"]} == {"Llama-3-8B", "Qwen3-235B-A22B"}
    code, out, _ = run(capsys, "eval", "storage", "--models", "Llama-3-8B", *plot_args(tmp_path / "s.png"))
    assert code == 0 and "KV / SIFT" in out
    assert_png(tmp_path / "s.png")


def test_eval_sweep_and_calibrate(capsys, tmp_path, tiny_ckpt, small_corpus, monkeypatch):
    from sift_cli.config import profile_defaults

    code, out, e = run(capsys, "eval", "sweep", "--corpus", small_corpus, "--model", tiny_ckpt, "--device", "cpu",
                       "--n-prompts", 1, "--docs-per-prompt", 2, "--points", "16,0.001,0.01,0.1;32,0.01,0.03,0.3",
                       "--max-new-tokens", 2, "--recall", "--json", *plot_args(tmp_path / "sweep.png"))
    assert code == 0, e
    assert_png(tmp_path / "sweep.png")
    pts = json.loads(out)["points"]
    assert len(pts) == 2 and all(0 < p["density"] <= 1 and p["la_recall"] is not None for p in pts)
    assert pts[1]["density"] <= pts[0]["density"] + 1e-9
    monkeypatch.chdir(tmp_path)
    code, out, e = run(capsys, "calibrate", small_corpus, "--model", tiny_ckpt, "--device", "cpu", "--n-prompts", 1,
                       "--docs-per-prompt", 2, "--points", "16,0.001,0.01,0.1;32,0.01,0.03,0.3;16,0,0,0",
                       "--max-kl", 1e9, "--max-new-tokens", 2, "--block-m", 16, "--block-n", 16, "--json")
    assert code == 0, e
    res = json.loads(out)
    dens = [c["density"] for c in res["candidates"]]
    assert dens == sorted(dens) and dens[0] < dens[-1]
    d = profile_defaults(tmp_path / "sift.toml")  # the sparsest candidate meets a target that everything meets
    assert (d["tile"], d["alpha"]) == (res["candidates"][0]["tile_size"], res["candidates"][0]["alpha"])
    assert res["chosen"]["density"] == pytest.approx(dens[0]) and res["config"].endswith("sift.toml")
    assert res["noise_floor"]["kl_median"] > 0 and res["chosen"]["kl_over_noise_median"] is not None


def test_calibrate_the_mass_rule_to_the_noise_floor(capsys, tmp_path, tiny_ckpt, small_corpus, monkeypatch):
    from sift_cli.config import profile_defaults, resolve_profile_config

    monkeypatch.chdir(tmp_path)
    base = ["calibrate", small_corpus, "--model", tiny_ckpt, "--device", "cpu", "--n-prompts", 1,
            "--docs-per-prompt", 2, "--rule", "mass", "--tiles", "16", "--epsilons", "0.01,0.3",
            "--ca-epsilons", "0.05", "--max-new-tokens", 2, "--block-m", 16, "--block-n", 16]
    code, out, e = run(capsys, *base, "--max-kl-over-noise", 1e9, "--json")
    assert code == 0, e
    res = json.loads(out)
    assert res["rule"] == "mass" and res["chosen"]["epsilon"] == 0.3  # the sparser one meets an easy target
    d = profile_defaults(tmp_path / "sift.toml")
    assert (d["rule"], d["epsilon"], d["ca_epsilon"], d["tile"]) == ("mass", 0.3, 0.05, 16)
    cfg = resolve_profile_config("cpu", {}, read_file=True, config_file=tmp_path / "sift.toml").profile
    assert (cfg.rule, cfg.epsilon) == ("mass", 0.3)
    code, out, e = run(capsys, *base, "--max-kl-over-noise", 0, "--dry-run")
    assert code == 4 and "× the noise floor at best" in e
    code, _, e = run(capsys, *base, "--min-recall", 0.9)
    assert code == 2 and "--min-recall measures the paper rule" in e


def test_calibrate_without_a_candidate_writes_nothing(tiny_lm, small_corpus):
    from sift_cli.corpus import CorpusFormat
    from sift_cli.lab.eval.calibrate import Target, calibrate as run_calibrate
    from sift_cli.lab.eval.prompt_sets import corpus_prompt_set
    from sift_cli.lab.eval.sweep import parse_points

    pset = corpus_prompt_set(small_corpus, CorpusFormat(), 1, 2)
    res = run_calibrate(tiny_lm, pset, parse_points("32,0.03,0.03,0.5"), Target(max_kl=0.0, min_recall=1.0),
                        max_new_tokens=1)
    assert res["chosen"] is None and len(res["evaluated"]) == 1 and res["evaluated"][0]["recall"] is not None


def test_eval_recall_from_shards_and_prompts(capsys, tmp_path, tiny_ckpt, tiny_lm, small_corpus):
    from sift_cli.profile.job import profile_corpus
    from sift_cli.config import ProfileConfig

    profile_corpus(small_corpus, tmp_path / "sh", tiny_lm, ProfileConfig(tile=16), num_shards=1)
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"doc_ids": ["doc03", "doc01", "doc00"], "question": "What jumps?"}) + "\n")
    code, out, e = run(capsys, "eval", "recall", "--shards", tmp_path / "sh", "--prompts", pf, "--model", tiny_ckpt,
                       "--device", "cpu", "--save", tmp_path / "r.json", *plot_args(tmp_path / "recall.png"))
    assert code == 0, e
    assert_png(tmp_path / "recall.png")
    assert "LA" in out and "per layer" in out
    assert json.loads((tmp_path / "r.json").read_text())["thresholds"]["tile_size"] == 16
    # a mass-rule set has no thresholds: its recall counts cells at --alpha / --beta as truly high
    profile_corpus(small_corpus, tmp_path / "mass", tiny_lm, ProfileConfig(tile=16, rule="mass"), num_shards=1)
    code, out, e = run(capsys, "eval", "recall", "--shards", tmp_path / "mass", "--prompts", pf, "--model", tiny_ckpt,
                       "--device", "cpu", "--alpha", "0.002", "--json")
    assert code == 0, e
    res = json.loads(out)
    assert res["source"]["rule"] == "mass" and res["thresholds"]["alpha"] == 0.002


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    from sift_cli.lab import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SiftError, match="matplotlib"):
        plots.plot_storage({"models": []}, tmp_path / "x.png")


def test_bench_prefill_needs_a_gpu_or_runs_a_cpu_smoke_pass(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, _, e = run(capsys, "bench", "prefill", "--models", "llama3-8b")
    assert code == 2 and "GPU" in e and "--cpu-smoke" in e
    code, out, e = run(capsys, "bench", "prefill", "--models", "llama3-8b", "--cpu-smoke", "--lengths", "300",
                       "--repeat", 1, "--warmup", 0, "--unprofiled", 1, "--json", "--save", tmp_path / "b.json",
                       *plot_args(tmp_path / "bench.png"))
    assert code == 0, e
    assert_png(tmp_path / "bench.png")
    res = json.loads(out)
    modes = {r["mode"] for r in res["rows"]}
    assert {"full", "no-attention", "sift-gather", "cacheblend"} <= modes, res["rows"]  # auto on a CPU: gather
    sift = [r for r in res["rows"] if r["mode"] == "sift-gather"][0]
    assert 0 < sift["cell_density"] <= 1 and sift["ideal_ms"] > 0 and sift["energy_note"] == "GPU needed"
    assert "1 of 2 documents unprofiled" in sift["pattern"]
    assert (tmp_path / "b.json").is_file() and res["summary"][0]["tokens"] == 300
    # a result file: provenance, one protocol, and every row's baseline timed in that protocol
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["kind"] == "bench-prefill" and saved["rows"] == res["rows"] and saved["command"].startswith("sift")
    assert saved["versions"]["torch"] and saved["protocol"]["timing"] == "eager"
    for r in res["rows"]:
        assert r["protocol"] == "eager" and r["baseline_protocol"] == "eager", r
    assert sift["ideal_ms"] <= sift["ideal_computed_ms"] and sift["allowed_density"] <= sift["cell_density"]
