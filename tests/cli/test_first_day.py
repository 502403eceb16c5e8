"""What a first day runs into: bad flags and paths reported before the model loads, error lines that say what to
do, Ctrl-C that says how to resume, a progress ETA that shows, full tables in logs, prefill defaults that suit the
device, and `sift calibrate`'s own outcome when no candidate meets the target."""

import io
import json

import pytest
import torch

from ..helpers import TRAINING_TEXT
from .test_cli import assert_one_line_error, run


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a command loads a model."""
    import sift_cli.launch.worker as worker
    import sift_cli.prefill.job as prefill_job

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(worker, "load_model", refuse)
    monkeypatch.setattr(prefill_job, "load_model", refuse)


def test_profile_checks_flags_paths_and_corpus_before_the_model(tmp_path, small_corpus, capsys, no_model):
    out = tmp_path / "o"
    for args, fragments in (([tmp_path / "missing"], ("corpus not found", " — ")),
                            ([small_corpus, "--tile", 48], ("--tile 48",)),
                            ([small_corpus, "--alpha", 2], ("--alpha 2",)),
                            ([small_corpus, "--stats", "fast"], ("--stats fast",)),
                            ([tmp_path / "c.csv"], ("corpus not found",))):
        code, _, err = run(capsys, "profile", *args, "--out", out)
        assert_one_line_error(code, err, *fragments)
    (tmp_path / "c.csv").write_text("x")
    code, _, err = run(capsys, "profile", tmp_path / "c.csv", "--out", out)
    assert_one_line_error(code, err, "unknown format", " — ")
    (tmp_path / "c.jsonl").write_text('{"id": 1, "body": "x"}\n')
    code, _, err = run(capsys, "profile", tmp_path / "c.jsonl", "--out", out)
    assert_one_line_error(code, err, "no field 'text'", "--text-field")
    assert not out.exists()


def test_prefill_checks_before_the_model(tmp_path, shard_set, capsys, no_model):
    q, ids = tmp_path / "q.txt", tmp_path / "ids.txt"
    ids.write_text("doc01\n")
    q.write_text("  \n")
    base = ["prefill", "--shards", shard_set, "--docs", ids, "--query", q]
    code, _, err = run(capsys, *base)
    assert_one_line_error(code, err, "the query is empty — ")
    q.write_text("What jumps?")
    code, _, err = run(capsys, *base, "--backend", "fast")
    assert_one_line_error(code, err, "--backend fast")
    code, _, err = run(capsys, *base, "--device", "gpu")
    assert_one_line_error(code, err, "--device gpu")
    code, _, err = run(capsys, *base, "--block-n", 96)
    assert_one_line_error(code, err, "--block-n")
    code, _, err = run(capsys, "prefill", "--shards", tmp_path / "nowhere", "--docs", ids, "--query", q)
    assert_one_line_error(code, err, "nowhere")


@pytest.fixture
def shard_set(tmp_path, tiny_lm, small_corpus):
    from sift_cli.config import ProfileConfig
    from sift_cli.profile.job import profile_corpus

    profile_corpus(small_corpus, tmp_path / "s", tiny_lm, ProfileConfig(tile=16), num_shards=2)
    return tmp_path / "s"


def test_unknown_id_says_what_to_do(tmp_path, shard_set, tiny_ckpt, capsys):
    ids, q = tmp_path / "ids.txt", tmp_path / "q.txt"
    ids.write_text("doc01\nno-such-doc\n")
    q.write_text("What jumps?")
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", ids, "--query", q, "--model", tiny_ckpt)
    assert_one_line_error(code, err, "'no-such-doc' is not in", " — ")


def test_ctrl_c_during_profile_says_how_to_resume(tmp_path, small_corpus, tiny_ckpt, capsys, monkeypatch):
    from sift_cli.launch.worker import ProfileWorker

    def interrupted(self, progress=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(ProfileWorker, "run", interrupted)
    code, _, err = run(capsys, "profile", small_corpus, "--out", tmp_path / "o", "--model", tiny_ckpt)
    assert code == 130 and err.startswith("interrupted — run the same command again to resume")


def test_ctrl_c_anywhere_says_interrupted(tmp_path, capsys, monkeypatch):
    import sift_cli.shards.inspection as inspection

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspection, "inspect_shards", interrupted)
    code, _, err = run(capsys, "inspect", tmp_path)
    assert code == 130 and err.strip() == "interrupted"  # typer alone would exit 130 silently


def test_progress_time_left_shows_when_updates_are_slow():
    from rich.progress import Progress

    from sift_cli.cli.console import TimeLeftColumn

    col = TimeLeftColumn()
    with Progress(col, disable=True) as p:
        t = p.add_task("x", total=100)
        assert col.render(p.tasks[0]).plain == "-:--:--"
        task = p.tasks[0]
        task.start_time = task.get_time() - 120  # one batch took two minutes: rich's own column shows -:--:--
        p.update(t, completed=25)
        assert col.render(p.tasks[0]).plain in ("0:06:00", "0:05:59", "0:06:01")


def test_tables_off_a_terminal_keep_whole_values():
    from rich.table import Table

    from sift_cli.cli.console import _Console

    buf = io.StringIO()
    console = _Console(file=buf, highlight=False, soft_wrap=True)
    t = Table()
    for i in range(14):
        t.add_column(f"a long column header {i}")
    t.add_row(*[f"{403_123_456 + i:,}" for i in range(14)])
    console.print(t)
    text = buf.getvalue()
    assert "403,123,469" in text and "…" not in text


def test_prefill_defaults_suit_the_device(tiny_lm, shard_set):
    from sift_cli.prefill.assemble import assemble
    from sift_cli.prefill.options import PrefillOptions, timing_defaults, with_device_defaults
    from sift_cli.prefill.report import run_prefill
    from sift_cli.shards.reader import ShardSet

    assert timing_defaults("cpu", 5000) == {"repeat": 1, "warmup": 0}  # the rule: tests/test_timing_rule.py
    assert timing_defaults("cuda:0") == {"repeat": 3, "warmup": 1}
    assert with_device_defaults(PrefillOptions(repeat=5), torch.device("cpu")).repeat == 5
    calls = []
    prompt = assemble(ShardSet(shard_set), tiny_lm, ["doc01", "doc02"], "What jumps?")
    r = run_prefill(tiny_lm, prompt, PrefillOptions(backend="reference", max_new_tokens=2, repeat=1),
                    progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 2), (2, 2)]  # --repeat 1 alone: one full-recompute and one SIFT forward, no warm-up
    assert len(r["dense"]["runs_ms"]) == 1


def test_calibrate_fits_prompts_in_the_context_and_has_its_own_outcome(tmp_path, tiny_ckpt, capsys, monkeypatch):
    """Long documents: prompts keep the documents that fit the (1024-token) context instead of failing after the
    statistics pass; no candidate meeting the target exits 4 with advice from what was measured."""
    from sift_cli.cli.calibrate import NO_CANDIDATE

    corpus = tmp_path / "c"
    corpus.mkdir()
    for i in range(6):  # 150 to 550 tokens each: five of them do not fit in one prompt
        (corpus / f"d{i}.txt").write_text(" ".join(TRAINING_TEXT[(i + j) % 5] for j in range(6 + 4 * i)))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "calibrate", corpus, "--max-kl", 0, "--min-recall", 1, "--model", tiny_ckpt,
                         "--device", "cpu", "--points", "16,0.3,0.3,0.9", "--docs-per-prompt", 5, "--n-prompts", 2,
                         "--max-new-tokens", 1, "--json")
    assert code == NO_CANDIDATE == 4, out
    res = json.loads(out)
    assert all(n <= 1024 for n in res["dense_tokens"]) and res["prompt_set"]["docs_per_prompt"][-1] < 5
    assert res["chosen"] is None and "recall" in res["advice"] and "loosen" in res["advice"]
    assert not (tmp_path / "sift.toml").exists()
    (corpus / "d9.txt").write_text("zebra " * 3000)  # longer than the context: never sampled
    for f in corpus.glob("d[0-5].txt"):
        f.unlink()
    code, _, err = run(capsys, "calibrate", corpus, "--max-kl", 0, "--model", tiny_ckpt, "--device", "cpu",
                       "--points", "32,0.03,0.03,0.5", "--docs-per-prompt", 1)
    assert_one_line_error(code, err, "no document fits the model's context", " — ")
