"""Input mistakes said in one line, and before the model loads where no model is needed to see them (a loader
that raises stands in for the model); a --profile-missing failure after the prefill that keeps its report; a full
disk said with its path and the space free."""

import errno
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .test_cli import assert_one_line_error, run
from .test_first_day import no_model, shard_set  # noqa: F401  (fixtures)


def _unwritable(monkeypatch):
    """What a read-only folder does to a write: the tests run as root too, where a mode would not stop one."""
    import sift_cli.output_dirs as output_dirs

    def refuse(directory):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(output_dirs, "_probe", refuse)


@pytest.fixture
def prompt_files(tmp_path):
    ids, q = tmp_path / "ids.txt", tmp_path / "q.txt"
    ids.write_text("doc01\ndoc02\n")
    q.write_text("What jumps?")
    return ids, q


def test_prefill_refuses_bad_values_and_paths_before_the_model(tmp_path, shard_set, prompt_files, capsys,  # noqa: F811
                                                              no_model):  # noqa: F811
    ids, q = prompt_files
    base = ["prefill", "--shards", shard_set, "--docs", ids, "--query", q]
    for extra, fragments in ((["--max-new-tokens", -3], ("--max-new-tokens -3", "at least 0")),
                             (["--repeat", 0], ("--repeat 0",)), (["--warmup", -1], ("--warmup -1",))):
        code, _, err = run(capsys, *base, *extra)
        assert_one_line_error(code, err, *fragments)
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", ids, "--query", tmp_path)
    assert_one_line_error(code, err, "is a folder", "the question")
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", tmp_path, "--query", q)
    assert_one_line_error(code, err, "--docs", "is a folder")


def test_prefill_refuses_repeated_and_unknown_ids_before_the_model(tmp_path, shard_set, prompt_files,  # noqa: F811
                                                                  capsys, no_model):  # noqa: F811
    ids, q = prompt_files
    ids.write_text("doc01\ndoc02\ndoc01\n")
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", ids, "--query", q)
    assert_one_line_error(code, err, "'doc01' (2 times)", "more than once", " — ")
    ids.write_text("doc01\nno-such-doc\n")
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", ids, "--query", q)
    assert_one_line_error(code, err, "'no-such-doc' is not in", " — ")
    ids.write_text("doc01\nnope-1\nnope-2\n")
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", ids, "--query", q)
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith("error: 2 documents") and len(lines) == 3
    assert "'nope-1'" in lines[1] and "'nope-2'" in lines[2]


def test_prefill_refuses_paths_that_are_no_shard_set(tmp_path, prompt_files, capsys, no_model):  # noqa: F811
    ids, q = prompt_files
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), other / "data.parquet")
    for shards, fragments in ((other, ("holds Parquet files but no sift shard set", "sift profile")),
                              (other / "data.parquet", ("is a file", "sift profile --out")),
                              (ids.parent / "empty", ("holds no sift shard set",))):
        shards.mkdir(exist_ok=True) if shards.suffix == "" else None
        code, _, err = run(capsys, "prefill", "--shards", shards, "--docs", ids, "--query", q)
        assert_one_line_error(code, err, *fragments)
        assert "finalize" not in err and "manifest" not in err


def test_profile_missing_folder_checked_before_the_model(tmp_path, shard_set, prompt_files, capsys,  # noqa: F811
                                                         monkeypatch, no_model):  # noqa: F811
    ids, q = prompt_files
    base = ["prefill", "--shards", shard_set, "--docs", ids, "--query", q, "--profile-missing"]
    (tmp_path / "a-file").write_text("x")
    code, _, err = run(capsys, *base, tmp_path / "a-file")
    assert_one_line_error(code, err, "is a file, not a folder")
    code, _, err = run(capsys, *base, tmp_path / "a-file" / "sub")
    assert_one_line_error(code, err, "cannot be created")
    with monkeypatch.context() as m:
        _unwritable(m)
        code, _, err = run(capsys, *base, tmp_path / "new" / "added")
        assert_one_line_error(code, err, "cannot write there", "Permission denied", " — ")
    assert not (tmp_path / "new").exists()


def test_profile_missing_of_another_tile_refused_before_the_model(tmp_path, shard_set, prompt_files,  # noqa: F811
                                                                  tiny_lm, small_corpus, capsys, monkeypatch):
    from sift_cli.config import ProfileConfig
    from sift_cli.profile.job import profile_corpus

    ids, q = prompt_files
    other = tmp_path / "t32"
    profile_corpus(small_corpus, other, tiny_lm, ProfileConfig(tile=32), num_shards=2, write_index=False)
    (other / "manifest.parquet").unlink(missing_ok=True)
    shutil.rmtree(other / "store", ignore_errors=True)  # a set not finished: the prompt does not read it
    import sift_cli.prefill.job as prefill_job

    monkeypatch.setattr(prefill_job, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", ids, "--query", q, "--profile-missing",
                       other)
    assert_one_line_error(code, err, "another tile_size", "give another folder")
    shutil.rmtree(other)
    profile_corpus(small_corpus, other, tiny_lm, ProfileConfig(tile=32), num_shards=2)  # finished: it is read
    code, _, err = run(capsys, "prefill", "--shards", shard_set, "--docs", ids, "--query", q, "--profile-missing",
                       other)
    assert_one_line_error(code, err, "another tile_size")


def test_profile_out_checked_before_the_model(tmp_path, shard_set, small_corpus, capsys, monkeypatch,  # noqa: F811
                                              no_model):  # noqa: F811
    code, _, err = run(capsys, "profile", small_corpus, "--out", shard_set, "--tile", 32)
    assert_one_line_error(code, err, "tile 16, not 32", "--tile 16", " — ")
    code, _, err = run(capsys, "profile", small_corpus, "--out", shard_set, "--tile", 16, "--alpha", 0.5)
    assert_one_line_error(code, err, "alpha")
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, "profile", small_corpus, "--out", tmp_path / "f")
    assert_one_line_error(code, err, "--out", "is a file")
    _unwritable(monkeypatch)
    code, _, err = run(capsys, "profile", small_corpus, "--out", tmp_path / "ro")
    assert_one_line_error(code, err, "--out", "cannot write there")


def test_pretty_printed_json_array_is_one_line(tmp_path, capsys, no_model):  # noqa: F811
    records = [{"id": f"d{i}", "text": f"text {i}"} for i in range(50)]
    (tmp_path / "c.jsonl").write_text(json.dumps(records, indent=2))
    code, _, err = run(capsys, "profile", tmp_path / "c.jsonl", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "one JSON array over many lines", "jq -c")
    (tmp_path / "docs.jsonl").write_text(json.dumps(records[:2], indent=2))
    code, _, err = run(capsys, "prefill", "--shards", tmp_path, "--docs", tmp_path / "docs.jsonl", "--query",
                       tmp_path / "c.jsonl")
    assert_one_line_error(code, err, "one JSON array over many lines")


def test_profile_missing_failure_keeps_the_report_and_exits_5(tmp_path, shard_set, tiny_ckpt, capsys,  # noqa: F811
                                                              monkeypatch):
    import sift_cli.prefill.job as prefill_job

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prefill_job, "profile_dense_documents", disk_full)
    q, docs = tmp_path / "q.txt", tmp_path / "docs.jsonl"
    q.write_text("What jumps?")
    docs.write_text('{"id": "doc01"}\n{"id": "new", "text": "A fox jumps over the lazy dog."}\n')
    args = ["prefill", "--shards", shard_set, "--docs", docs, "--query", q, "--model", tiny_ckpt,
            "--backend", "reference", "--max-new-tokens", 1, "--profile-missing", tmp_path / "added"]
    code, out, err = run(capsys, *args)
    assert code == 5 and "speed-up" in out and "first token" in out
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: profiling the missing documents into") and "no space left" in lines[-1]
    assert "free" in lines[-1] and "Traceback" not in err
    code, out, _ = run(capsys, *args, "--json")
    assert code == 5 and "no space left" in json.loads(out)["profiled_missing"]["error"]


def test_full_disk_while_profiling_is_one_line_with_the_space_free(tmp_path, small_corpus, tiny_ckpt, capsys,
                                                                   monkeypatch):
    import sift_cli.profile.job as job

    def disk_full(path, rows, meta):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(job, "write_shard", disk_full)
    out = tmp_path / "o"
    code, _, err = run(capsys, "profile", small_corpus, "--out", out, "--model", tiny_ckpt, "--tile", 16)
    assert_one_line_error(code, err, str(out), "no space left on the device", "free)", " — ")


def test_profile_header_counts_every_record(tmp_path, tiny_ckpt, capsys):
    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n'
                                      '{"id": "c", "text": ""}\n{"id": "d", "text": "four"}\n')
    code, out, _ = run(capsys, "profile", tmp_path / "c.jsonl", "--out", tmp_path / "o", "--model", tiny_ckpt,
                       "--tile", 16)
    assert code == 0 and "4 documents in 1 shards (1 skipped, below)" in out, out


def test_validate_json_problems_carry_code_file_doc_id_row_and_message(shard_set, capsys):  # noqa: F811
    from sift_cli.shards.format import part_name

    (shard_set / part_name(1)).write_bytes(b"PAR1 garbage")
    code, out, _ = run(capsys, "validate", shard_set, "--json")
    problems = json.loads(out)["problems"]
    assert code == 1 and problems
    for p in problems:
        assert set(p) == {"code", "file", "doc_id", "row", "message"} and p["code"] and p["message"]
    assert any(p["file"] == part_name(1) for p in problems)


def test_calibrate_checks_before_the_model(tmp_path, small_corpus, capsys, monkeypatch):
    from sift_cli.lab.runs import ModelSpec

    monkeypatch.setattr(ModelSpec, "load", lambda self: pytest.fail("the model was loaded"))
    base = ["calibrate", small_corpus, "--max-kl", 0.1, "--device", "cpu", "--points", "16,0.3,0.3,0.9"]
    (tmp_path / "qs").mkdir()
    for extra, fragments in ((["--backend", "fast"], ("fast",)), (["--block-n", 0], ("--block-n 0",)),
                             (["--max-new-tokens", -3], ("--max-new-tokens -3",)),
                             (["--queries", tmp_path / "qs"], ("--queries", "is a folder")),
                             (["--config-out", tmp_path / "qs"], ("--config-out", "is a folder")),
                             (["--config-out", small_corpus / "doc00.txt" / "sift.toml"], ("is a file",))):
        code, _, err = run(capsys, *base, *extra)
        assert_one_line_error(code, err, *fragments)
    _unwritable(monkeypatch)
    code, _, err = run(capsys, *base, "--config-out", tmp_path / "ro" / "sift.toml")
    assert_one_line_error(code, err, "cannot write there")


def test_measurements_check_the_files_they_write_before_they_start(tmp_path, capsys, monkeypatch):
    """--save, --plot and --results of a measurement of minutes to hours are checked before it starts."""
    import sift_cli.lab.eval.sweep as sweep
    import sift_cli.lab.plots as plots
    from sift_cli.lab.runs import ModelSpec

    monkeypatch.setattr(ModelSpec, "load", lambda self: pytest.fail("the model was loaded"))
    monkeypatch.setattr(sweep, "sweep_report", lambda *a, **k: pytest.fail("the sweep started"))
    base = ["eval", "sweep", "--data", "nq", "--points", "16,0.3,0.3,0.9"]
    code, _, err = run(capsys, *base, "--save", tmp_path)
    assert_one_line_error(code, err, "--save", "is a folder")
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, *base, "--plot", tmp_path / "f" / "p.png")
    assert_one_line_error(code, err, "--plot's folder", "is a file")

    def no_matplotlib():
        raise plots.SiftError("--plot needs matplotlib: pip install 'sift-cli[plot]' (or pip install matplotlib)")

    monkeypatch.setattr(plots, "_plt", no_matplotlib)
    code, _, err = run(capsys, *base, "--plot", tmp_path / "p.png")
    assert_one_line_error(code, err, "--plot needs matplotlib")
    code, _, err = run(capsys, "eval", "qa", "--nq", "--results", tmp_path, "--modes", "full")
    assert_one_line_error(code, err, "--results", "is a folder")
