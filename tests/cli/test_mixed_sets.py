"""Shard files of two settings (tile 16 and tile 32) mixed in one directory: every command that opens a shard set
refuses it with the same one-line error, whichever file the requested documents come from. The serving store
opens in constant time, so prefill checks a bucket only when a prompt reads it: a document of the foreign file is
refused (its bucket's store file no longer matches it) and the remedy named, `sift index`, refuses the mix."""

import json
import shutil

import pytest

from sift_cli.profile.job import profile_corpus
from sift_cli.config import ProfileConfig
from sift_cli.shards.format import part_name
from sift_cli.shards.ids import doc_id_listing

from .test_cli import assert_one_line_error, run


@pytest.fixture
def mixed(tmp_path, tiny_lm, small_corpus):
    a, b = tmp_path / "a", tmp_path / "b"
    profile_corpus(small_corpus, a, tiny_lm, ProfileConfig(tile=16), num_shards=2)
    profile_corpus(small_corpus, b, tiny_lm, ProfileConfig(tile=32), num_shards=2)
    ids = {d["doc_id"]: d["file"] for d in doc_id_listing(a)["documents"]}
    shutil.copy(b / part_name(1), a / part_name(1))  # same documents and names, the other tile size
    return a, ids


def test_every_command_refuses_a_mixed_directory(mixed, tmp_path, tiny_ckpt, capsys):
    d, ids = mixed
    for args in (["inspect", d], ["status", d], ["ids", d], ["eval", "storage", "--shards", d]):
        code, _, err = run(capsys, *args)
        assert_one_line_error(code, err, "tile_size differs", "keep one shard set per directory")
    code, stdout, _ = run(capsys, "validate", d, "--json")
    assert code == 1 and any("sift.tile_size differs" in p["message"] for p in json.loads(stdout)["problems"])

    q = tmp_path / "q.txt"
    q.write_text("What jumps?")
    for part in (part_name(0), part_name(1)):  # documents of the tile-16 file, then of the tile-32 file
        docs = tmp_path / f"ids-{part}.txt"
        docs.write_text("\n".join([i for i, f in ids.items() if f == part][:2]) + "\n")
        if part == part_name(1):  # the serving store's copy of this bucket no longer matches its part file
            code, _, err = run(capsys, "prefill", "--shards", d, "--docs", docs, "--query", q, "--model", tiny_ckpt)
            assert_one_line_error(code, err, f"{part} changed after it was built", f"sift index {d}")
            code, _, err = run(capsys, "index", d)  # the remedy it names: refused, naming the mix
            assert_one_line_error(code, err, "tile_size differs", "keep one shard set per directory")
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(json.dumps({"doc_ids": docs.read_text().split(), "question": "What jumps?"}) + "\n")
        code, _, err = run(capsys, "eval", "recall", "--shards", d, "--prompts", prompts, "--model", tiny_ckpt)
        assert_one_line_error(code, err, "tile_size differs")
