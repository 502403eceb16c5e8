"""Documents that cannot be profiled: skipped and counted (all reported in one pass, each with its reason, recorded
in its bucket's file), or, with --strict, every one listed before any model work; `sift ids` and prefill say why
an id is absent."""

import json

import pyarrow.parquet as pq
import pytest

from sift_cli.config import ProfileConfig
from sift_cli.errors import SiftError
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.format import decode_metadata
from sift_cli.shards.ids import doc_id_listing, id_status
from sift_cli.shards.reader import ShardSet
from sift_cli.shards.validate import validate_path

from ..cli.test_cli import run

CFG = ProfileConfig(tile=16)


@pytest.fixture
def messy_corpus(small_corpus):
    (small_corpus / "empty.txt").write_text("  \n")
    (small_corpus / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (small_corpus / "huge.txt").write_text("zebra quartz " * 400)  # longer than the tiny model's context
    (small_corpus / "notes.rst").write_text("not a document")
    (small_corpus / "UPPER.TXT").write_text("Sphinx of black quartz, judge my vow.")
    return small_corpus


def test_skipped_documents_are_recorded_with_their_reason(tmp_path, tiny_lm, messy_corpus):
    out = tmp_path / "o"
    rep = profile_corpus(messy_corpus, out, tiny_lm, CFG, num_shards=2)
    assert rep.profiled == 13  # the twelve, and UPPER.TXT (extensions in any case)
    reasons = {s["doc_id"]: s["reason"] for s in rep.skipped}
    assert set(reasons) == {"empty", "latin1", "huge"}
    assert reasons["empty"] == "empty document" and "UTF-8" in reasons["latin1"]
    assert reasons["huge"].startswith("longer than the model's context")
    assert len(rep.ignored_files) == 1 and "notes.rst" in rep.ignored_files[0]
    js = rep.to_json()
    assert js["skipped_documents"] == 3 and js["skipped_too_long"] == 1 and len(js["ignored_files"]) == 1

    recorded = {}
    for p in sorted(out.glob("part-*.parquet")):
        meta = decode_metadata(pq.read_schema(p).metadata)
        assert sorted(meta["sift.skipped"]) == sorted(meta["sift.skip_reasons"])
        recorded.update(meta["sift.skip_reasons"])
    assert recorded == reasons
    assert validate_path(out)["ok"]
    again = profile_corpus(messy_corpus, out, tiny_lm, CFG)
    assert again.shards_reused == 2 and again.profiled == 0  # skipped documents do not make a bucket look unfinished

    listing = doc_id_listing(out)
    assert (listing["profiled"], listing["skipped"]) == (13, 3)
    by_id = {r["doc_id"]: r for r in listing["documents"]}
    assert by_id["huge"]["status"] == "skipped" and by_id["doc03"]["status"] == "profiled"
    assert [r["status"] for r in id_status(out, ["doc01", "huge", "nope"])] == ["profiled", "skipped", "absent"]
    assert id_status(out, ["doc01"]) == [by_id["doc01"]]  # a point read through the store: the listing's entry

    shards = ShardSet(out)
    with pytest.raises(SiftError, match=r"'huge' was skipped when .* profiled: longer than the model's context .* — "):
        shards.get(["doc01", "huge"])
    with pytest.raises(SiftError, match=r"'nope' is not in the shard set .* — .*sift ids"):
        shards.get(["nope"])


def test_ids_command_and_prefill_say_why(tmp_path, tiny_ckpt, messy_corpus, capsys):
    out = tmp_path / "o"
    code, _, _ = run(capsys, "profile", messy_corpus, "--out", out, "--model", tiny_ckpt, "--tile", 16, "--json")
    assert code == 0
    code, stdout, err = run(capsys, "ids", out)
    assert code == 0 and "13 profiled, 3 skipped" in err
    rows = dict(line.split("\t", 1) for line in stdout.strip().splitlines())
    assert rows["huge"].startswith("skipped\tlonger than the model's context")
    assert rows["doc00"].startswith("profiled\tpart-")
    code, stdout, _ = run(capsys, "ids", out, "--json")  # JSON Lines, one document a line, in doc_id order
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert code == 0 and [x["doc_id"] for x in lines] == sorted(rows)
    assert sum(x["status"] == "skipped" for x in lines) == 3

    (tmp_path / "ids.txt").write_text("doc01\nhuge\n")
    (tmp_path / "q.txt").write_text("What jumps?")
    code, _, err = run(capsys, "prefill", "--shards", out, "--docs", tmp_path / "ids.txt", "--query",
                       tmp_path / "q.txt", "--model", tiny_ckpt)
    assert code == 2 and "skipped" in err and "longer than the model's context" in err
    assert "not in the shard set" not in err


def test_profile_reports_what_it_skipped(tmp_path, tiny_ckpt, messy_corpus, capsys):
    code, stdout, _ = run(capsys, "profile", messy_corpus, "--out", tmp_path / "o", "--model", tiny_ckpt)
    assert code == 0
    assert "skipped 3 documents" in stdout and "empty.txt: empty document" in stdout
    assert "latin1.txt: not valid UTF-8" in stdout and "huge.txt" in stdout
    assert "ignored 1 files" in stdout and "notes.rst" in stdout


def test_strict_lists_every_bad_document_before_the_model_loads(tmp_path, tiny_ckpt, messy_corpus, capsys,
                                                                monkeypatch):
    import sift_cli.launch.worker as worker

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the corpus was checked")

    with monkeypatch.context() as m:
        m.setattr(worker, "load_model", no_model)
        code, _, err = run(capsys, "profile", messy_corpus, "--out", tmp_path / "o", "--model", tiny_ckpt, "--strict")
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith("error:") and "2 documents cannot be profiled — " in lines[0]
    assert "--strict" in lines[0] and len(lines) == 3 and "empty.txt" in err and "latin1.txt" in err
    assert not (tmp_path / "o").exists()

    for name in ("empty.txt", "latin1.txt"):
        (messy_corpus / name).unlink()
    (messy_corpus / "huge2.txt").write_text("quartz zebra " * 400)
    code, _, err = run(capsys, "profile", messy_corpus, "--out", tmp_path / "o", "--model", tiny_ckpt, "--strict")
    assert code == 2 and "2 documents are longer than the model's context" in err
    assert "huge.txt" in err and "huge2.txt" in err
