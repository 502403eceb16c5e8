import filecmp
import json

import pyarrow.parquet as pq
import pytest

from sift_cli.config import ProfileConfig
from sift_cli.errors import SiftError
from sift_cli.profile import job as jobmod
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.files import list_parts
from sift_cli.shards.format import MANIFEST, decode_metadata, part_name
from sift_cli.shards.reader import ShardSet
from sift_cli.shards.validate import validate_path

CFG = ProfileConfig(tile=16, batch_tokens=2048)


def same_shard_sets(a, b):
    names = sorted(p.name for p in a.glob("*.parquet"))
    assert names == sorted(p.name for p in b.glob("*.parquet"))
    for n in names:
        assert filecmp.cmp(a / n, b / n, shallow=False), n


def test_profile_writes_valid_shards(tmp_path, tiny_lm, small_corpus):
    out = tmp_path / "shards"
    rep = profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=3)
    assert rep.documents == rep.profiled == 12 and rep.shards_written == 3 and rep.manifest
    assert validate_path(out)["ok"]
    meta = decode_metadata(pq.read_schema(out / part_name(0)).metadata)
    assert meta["sift.tile_size"] == 16 and meta["sift.n_heads"] == 4 and meta["sift.num_shards"] == 3
    assert meta["sift.prefix_token_ids"][0] == 1
    for p in list_parts(out):
        ids = pq.read_table(p, columns=["doc_id"]).column("doc_id").to_pylist()
        assert ids == sorted(ids)
    shards = ShardSet(out)
    assert len(shards) == 12
    rec = shards.get(["doc05"])[0]
    assert rec.doc_id == "doc05" and len(rec.tokens) > 0


def test_output_is_deterministic(tmp_path, tiny_lm, small_corpus):
    a, b = tmp_path / "a", tmp_path / "b"
    profile_corpus(small_corpus, a, tiny_lm, CFG, num_shards=4)
    profile_corpus(small_corpus, b, tiny_lm, CFG, num_shards=4)
    same_shard_sets(a, b)


def test_resume_after_crash_gives_identical_shards(tmp_path, tiny_lm, small_corpus, monkeypatch):
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    profile_corpus(small_corpus, clean, tiny_lm, CFG, num_shards=4)

    real_write = jobmod.write_shard
    calls = {"n": 0}

    def dying_write(path, rows, meta):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # killed while the third shard was being written
        real_write(path, rows, meta)

    monkeypatch.setattr(jobmod, "write_shard", dying_write)
    with pytest.raises(KeyboardInterrupt):
        profile_corpus(small_corpus, crashed, tiny_lm, CFG, num_shards=4)
    assert len(list_parts(crashed)) == 2 and not (crashed / MANIFEST).exists()
    monkeypatch.setattr(jobmod, "write_shard", real_write)
    rep = profile_corpus(small_corpus, crashed, tiny_lm, CFG)  # num_shards taken from the directory
    assert rep.shards_reused == 2 and rep.shards_written == 2
    same_shard_sets(clean, crashed)
    rep = profile_corpus(small_corpus, crashed, tiny_lm, CFG)
    assert rep.profiled == 0 and rep.reused == 12


def test_interrupted_write_leaves_no_readable_file(tmp_path, tiny_lm, small_corpus, monkeypatch):
    import sift_cli.shards.files as shards

    def broken(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(shards.pq, "write_table", broken)
    with pytest.raises(OSError):
        profile_corpus(small_corpus, tmp_path / "o", tiny_lm, CFG, num_shards=2)
    assert list((tmp_path / "o").iterdir()) == []


def test_corpus_growth_redoes_only_touched_shards(tmp_path, tiny_lm, small_corpus):
    out = tmp_path / "o"
    profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=4)
    (small_corpus / "new.txt").write_text("A brand new document about zebras.")
    rep = profile_corpus(small_corpus, out, tiny_lm, CFG)
    assert rep.shards_written == 1 and rep.shards_reused == 3
    assert "new" in ShardSet(out)


def test_mixed_settings_are_refused(tmp_path, tiny_lm, small_corpus):
    out = tmp_path / "o"
    profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=2)
    with pytest.raises(SiftError, match="different tile_size"):
        profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=32), num_shards=2)
    with pytest.raises(SiftError, match="not 3"):
        profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=3)


def test_over_long_documents_are_skipped_or_strict(tmp_path, tiny_lm, small_corpus):
    (small_corpus / "huge.txt").write_text("zebra quartz " * 400)  # longer than the tiny model's context
    rep = profile_corpus(small_corpus, tmp_path / "o", tiny_lm, CFG, num_shards=2)
    assert rep.skipped_too_long == ["huge"] and rep.profiled == 12
    assert validate_path(tmp_path / "o")["ok"]
    again = profile_corpus(small_corpus, tmp_path / "o", tiny_lm, CFG)
    assert again.shards_reused == 2  # a skipped document does not make its shard look unfinished
    with pytest.raises(SiftError, match="huge.*longer than the model's context"):
        profile_corpus(small_corpus, tmp_path / "strict", tiny_lm, CFG, strict=True)
    assert not (tmp_path / "strict").exists()


def test_report_json(tmp_path, tiny_lm, small_corpus):
    rep = profile_corpus(small_corpus, tmp_path / "o", tiny_lm, CFG, num_shards=1)
    d = json.loads(json.dumps(rep.to_json()))
    assert d["documents"] == 12 and d["tokens"] > 0 and d["tokens_per_second"] > 0
