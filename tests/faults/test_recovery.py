"""Each state a run can leave a set in is named with one advice by status, validate and the docs, and following
that advice makes the set whole."""

import shutil

import pytest

from sift_cli.config import ProfileConfig
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.format import MANIFEST, part_name
from sift_cli.shards.recovery import ADVICE, advice, advice_table
from sift_cli.shards.status import shard_status
from sift_cli.shards.validate import validate_path
from sift_cli.store.index import index_set

from .harness import leftovers, set_rows

CFG = ProfileConfig(tile=16)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_lm):
    root = tmp_path_factory.mktemp("recovery")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"doc{i}.txt").write_text(f"Document {i}: " + "words and more words. " * (i + 2))
    profile_corpus(corpus, root / "ref", tiny_lm, CFG, num_shards=3)
    return root


def _follow(state, d, corpus, lm):
    """Do what the advice says (the command it names, as a library call)."""
    if state in ("unreadable-part", "interrupted-run"):
        return profile_corpus(corpus, d, lm, CFG, num_shards=3)
    if state == "manifest-missing":
        return shard_status(d, finalize=True)
    if state == "foreign-file":
        return shutil.move(d / "notes.parquet", d.parent / "notes.parquet")
    if state == "stale-store":
        return index_set(d)


@pytest.mark.parametrize("state", ["unreadable-part", "interrupted-run", "manifest-missing", "foreign-file",
                                   "stale-store"])
def test_following_the_advice_makes_the_set_whole(reference, tiny_lm, tmp_path, state):
    d = tmp_path / "set"
    shutil.copytree(reference / "ref", d)
    part = d / part_name(1)
    if state == "unreadable-part":
        part.write_bytes(part.read_bytes()[:100])
    elif state == "interrupted-run":
        part.unlink()
    elif state == "manifest-missing":
        (d / MANIFEST).unlink()
    elif state == "foreign-file":
        shutil.copy(part, d / "notes.parquet")
    else:
        (d / "store" / "part-00001.sbits").unlink()
    report = validate_path(d, workers=1)
    assert not report["ok"]
    if state != "unreadable-part" and state != "stale-store":  # these name the file's own problem
        assert any(advice(state, d, "notes.parquet") in p["message"] for p in report["problems"]), report
    if state == "unreadable-part":
        assert [b["file"] for b in shard_status(d)["bad"]] == [part.name]
    _follow(state, d, reference / "corpus", tiny_lm)
    assert validate_path(d, workers=1)["ok"]
    assert set_rows(d) == set_rows(reference / "ref")
    expected = [part.name + ".unreadable"] if state == "unreadable-part" else []
    assert leftovers(d) == expected  # the set-aside file stays until the user deletes it


def test_docs_give_the_same_advice():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    assert advice_table() in doc, "docs/cli.md: paste sift_cli.shards.recovery.advice_table() again"
    assert set(ADVICE) == {"unreadable-part", "interrupted-run", "manifest-missing", "foreign-file", "stale-store",
                           "set-aside"}
