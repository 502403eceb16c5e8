"""The CLI through its real entry point: exit codes, one-line errors, --json that parses."""

import json
import os
import subprocess
import sys

import pytest

from sift_cli.cli import main
from sift_cli.shards.format import part_name

from ..helpers import command_line


def run(capsys, *args):
    try:
        with command_line(*args):
            main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_one_line_error(code, err, *fragments):
    assert code != 0
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and "Traceback" not in err
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture
def profiled(tmp_path, tiny_ckpt, small_corpus, capsys):
    out = tmp_path / "shards"
    code, stdout, _ = run(capsys, "profile", small_corpus, "--out", out, "--model", tiny_ckpt, "--tile", 16,
                          "--num-shards", 2, "--json")
    assert code == 0
    return out, json.loads(stdout)


def test_profile_inspect_validate_status_json(profiled, capsys):
    out, rep = profiled
    assert rep["documents"] == 12 and rep["shards_written"] == 2
    code, stdout, _ = run(capsys, "inspect", out, "--json")
    assert code == 0 and json.loads(stdout)["documents"] == 12
    code, stdout, _ = run(capsys, "validate", out, "--json")
    assert code == 0 and json.loads(stdout)["ok"] is True
    code, stdout, _ = run(capsys, "status", out, "--json")
    assert code == 0 and json.loads(stdout)["done"] == 2
    code, stdout, _ = run(capsys, "inspect", out, "--doc", "doc04", "--layer", 1, "--head", 3)
    assert code == 0 and "CA" in stdout


def test_human_output(profiled, capsys):
    out, _ = profiled
    code, stdout, _ = run(capsys, "inspect", out)
    assert code == 0 and "LA density" in stdout and "smaller" in stdout
    code, stdout, _ = run(capsys, "validate", out)
    assert code == 0 and stdout.startswith("ok")


def test_validate_exit_1_lists_problems(profiled, capsys):
    out, _ = profiled
    (out / part_name(1)).write_bytes(b"PAR1 garbage")
    code, stdout, err = run(capsys, "validate", out)
    assert code == 1 and "problems" in err and part_name(1) in err
    code, stdout, _ = run(capsys, "validate", out, "--json")
    assert code == 1 and json.loads(stdout)["ok"] is False


def test_bad_inputs_give_one_line(tmp_path, tiny_ckpt, small_corpus, capsys):
    out = tmp_path / "o"
    code, _, err = run(capsys, "profile", tmp_path / "missing", "--out", out, "--model", tiny_ckpt)
    assert_one_line_error(code, err, "corpus not found")
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "profile", empty, "--out", out, "--model", tiny_ckpt)
    assert_one_line_error(code, err, "no documents")
    code, _, err = run(capsys, "profile", small_corpus, "--out", out, "--model", tmp_path / "no-model")
    assert_one_line_error(code, err, "no-model")
    code, _, err = run(capsys, "profile", small_corpus, "--out", out, "--model", tiny_ckpt, "--tile", 48)
    assert_one_line_error(code, err, "--tile 48")
    (small_corpus / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    code, _, err = run(capsys, "profile", small_corpus, "--out", out, "--model", tiny_ckpt, "--strict")
    assert_one_line_error(code, err, "latin1.txt", "UTF-8", " — ")
    assert not out.exists()
    code, _, err = run(capsys, "inspect", tmp_path / "nothing-here")
    assert_one_line_error(code, err, "not found")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    code, _, err = run(capsys, "inspect", bad)
    assert_one_line_error(code, err, "bad.parquet")


def test_strict_over_long(tmp_path, tiny_ckpt, small_corpus, capsys):
    (small_corpus / "huge.txt").write_text("zebra quartz " * 400)
    code, _, err = run(capsys, "profile", small_corpus, "--out", tmp_path / "o", "--model", tiny_ckpt, "--strict")
    assert_one_line_error(code, err, "huge", "context")
    assert not (tmp_path / "o").exists()
    code, stdout, _ = run(capsys, "profile", small_corpus, "--out", tmp_path / "o", "--model", tiny_ckpt, "--json")
    assert code == 0 and json.loads(stdout)["skipped_too_long"] == 1


def test_real_process_entry_point(tmp_path, tiny_ckpt, small_corpus):
    """The installed console script: exit codes and stderr of a separate process."""
    env = {**os.environ, "SIFT_DEBUG": ""}
    exe = [sys.executable, "-m", "sift_cli.cli"]
    ok = subprocess.run(exe + ["profile", str(small_corpus), "--out", str(tmp_path / "o"), "--model",
                               str(tiny_ckpt), "--json"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["profiled"] == 12
    bad = subprocess.run(exe + ["validate", str(tmp_path / "nope")], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr
    debug = subprocess.run(exe + ["validate", str(tmp_path / "nope")], capture_output=True, text=True,
                           env={**env, "SIFT_DEBUG": "1"})
    assert "Traceback" in debug.stderr
    usage = subprocess.run(exe + ["profile"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def test_profile_reads_thresholds_from_sift_toml(tmp_path, tiny_ckpt, small_corpus, capsys, monkeypatch):
    """`sift calibrate` writes sift.toml; `sift profile` takes its thresholds unless flags say otherwise."""
    import pyarrow.parquet as pq

    from sift_cli.shards.format import decode_metadata

    (tmp_path / "sift.toml").write_text("[profile]\ntile = 32\nalpha = 0.003\nbeta = 0.02\ngamma = 0.2\n")
    monkeypatch.chdir(tmp_path)
    code, _, _ = run(capsys, "profile", small_corpus, "--out", tmp_path / "a", "--model", tiny_ckpt,
                     "--num-shards", 1, "--json")
    meta = decode_metadata(pq.read_schema(tmp_path / "a" / part_name(0)).metadata)
    assert code == 0 and (meta["sift.tile_size"], meta["sift.alpha"], meta["sift.gamma"]) == (32, 0.003, 0.2)
    code, _, _ = run(capsys, "profile", small_corpus, "--out", tmp_path / "b", "--model", tiny_ckpt,
                     "--num-shards", 1, "--tile", 16, "--json")
    meta = decode_metadata(pq.read_schema(tmp_path / "b" / part_name(0)).metadata)
    assert code == 0 and (meta["sift.tile_size"], meta["sift.beta"]) == (16, 0.02)
