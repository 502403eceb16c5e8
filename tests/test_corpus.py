import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from sift_cli.corpus import CorpusFormat, load_documents
from sift_cli.errors import SiftError
from sift_cli.sample import sample_documents, write_sample_corpus


def test_directory_ids_are_relative_paths(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.txt").write_text("first")
    (tmp_path / "two.md").write_text("second")
    (tmp_path / ".hidden.txt").write_text("skip me")
    (tmp_path / "notes.bin").write_bytes(b"\x00")
    docs = load_documents(tmp_path)
    assert [d.doc_id for d in docs] == ["a/one", "two"]
    assert docs[0].text == "first\n\n"


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_variants_and_template(tmp_path, suffix):
    lines = "".join(json.dumps(r) + "\n" for r in [{"id": 1, "text": "alpha", "title": "A"},
                                                    {"id": "x", "text": "beta"}])
    path = tmp_path / f"c{suffix}"
    data = lines.encode()
    if suffix.endswith(".gz"):
        data = gzip.compress(data)
    elif suffix.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    docs = load_documents(path)
    assert [(d.doc_id, d.text) for d in docs] == [("1", "Title: A\nalpha\n\n"), ("x", "beta\n\n")]
    custom = load_documents(path, CorpusFormat(template="[{id}] {title}: {text}"))
    assert custom[0].text == "[1] A: alpha" and custom[1].text == "[x] : beta"


def test_parquet_with_custom_columns(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"pid": ["p1", "p2"], "body": ["one", "two"]}), path)
    docs = load_documents(path, CorpusFormat(id_field="pid", text_field="body"))
    assert [d.doc_id for d in docs] == ["p1", "p2"]
    with pytest.raises(SiftError, match="no column 'id'"):
        load_documents(path)


@pytest.mark.parametrize("make,match", [
    (lambda p: p.mkdir(), "no documents"),
    (lambda p: (p.mkdir(), (p / "e.txt").write_text("  \n")), "empty document"),
    (lambda p: (p.mkdir(), (p / "bad.txt").write_bytes(b"ok \xff\xfe")), "not valid UTF-8"),
    (lambda p: p.with_suffix(".jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n'),
     "duplicate document id"),
    (lambda p: p.with_suffix(".jsonl").write_text('{"id": 1, "text": "a"}\nnot json\n'), "invalid JSON"),
    (lambda p: p.with_suffix(".jsonl").write_text('{"id": 1, "body": "a"}\n'), "has no field 'text'"),
    (lambda p: p.with_suffix(".jsonl.gz").write_bytes(gzip.compress(b'{"id": 1, "text": "a"}\n' * 50)[:30]),
     "truncated or corrupt"),
    (lambda p: p.with_suffix(".parquet").write_bytes(b"PAR1 this is not parquet"), "not a readable Parquet"),
    (lambda p: p.with_suffix(".csv").write_text("x"), "unknown format"),
])
def test_bad_corpus_gives_one_clear_error(tmp_path, make, match):
    base = tmp_path / "corpus"
    make(base)
    target = next((p for p in tmp_path.iterdir()), base)
    with pytest.raises(SiftError, match=match):
        load_documents(target)


def test_missing_corpus(tmp_path):
    with pytest.raises(SiftError, match="corpus not found"):
        load_documents(tmp_path / "nope")


def test_sample_corpus_is_generated_from_python(tmp_path):
    docs = sample_documents()
    assert len(docs) >= 10 and all(len(t) > 500 for _, t in docs)
    assert "heapq" in dict(docs)["heapq"]
    write_sample_corpus(tmp_path)
    assert len(load_documents(tmp_path)) == len(docs)


def test_every_bad_document_is_reported_in_one_pass(tmp_path):
    """Empty, non-UTF-8 and field-less documents are all collected (with their reason), not only the first."""
    from sift_cli.corpus import load_corpus

    d = tmp_path / "dir"
    d.mkdir()
    (d / "good.txt").write_text("fine")
    (d / "empty.txt").write_text(" \n")
    (d / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    c = load_corpus(d)
    assert [x.doc_id for x in c.documents] == ["good"]
    assert {(b.doc_id, b.reason.split(" (")[0]) for b in c.bad} == {("empty", "empty document"),
                                                                   ("latin1", "not valid UTF-8")}
    with pytest.raises(SiftError) as exc:
        load_documents(d)
    assert "2 documents cannot be profiled — " in str(exc.value) and len(exc.value.details) == 2

    j = tmp_path / "c.jsonl"
    j.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b"}\n{"text": "no id"}\nnot json\n{"id": "e", "text": ""}\n'
                  b'{"id": "f", "text": "caf\xe9"}\n{"id": "g", "text": "also ok"}\n')
    c = load_corpus(j)
    assert [x.doc_id for x in c.documents] == ["a", "g"]
    lines = [b.line() for b in c.bad]
    assert len(lines) == 5 and all(f"c.jsonl:{n}:" in line for n, line in zip((2, 3, 4, 5, 6), lines))
    assert "no field 'text'" in lines[0] and "--text-field" in lines[0]  # says which field, and the flag
    assert "no field 'id'" in lines[1] and "--id-field" in lines[1]
    assert "invalid JSON" in lines[2] and "empty document" in lines[3] and "UTF-8" in lines[4]
    assert [b.doc_id for b in c.bad] == ["b", None, None, "e", None]


def test_directory_extensions_any_case_and_ignored_files_reported(tmp_path):
    from sift_cli.corpus import load_corpus

    (tmp_path / "A.txt").write_text("one")
    (tmp_path / "D.TXT").write_text("two")
    (tmp_path / "notes.Md").write_text("three")
    (tmp_path / "page.html").write_text("<p>four</p>")
    (tmp_path / "guide.rst").write_text("five")
    (tmp_path / ".hidden.rst").write_text("left out silently")
    c = load_corpus(tmp_path)
    assert [d.doc_id for d in c.documents] == ["A", "D", "notes"]
    assert sorted(f.origin.rsplit("/", 1)[-1] for f in c.ignored_files) == ["guide.rst", "page.html"]
    assert all("sift reads .txt and .md" in f.reason for f in c.ignored_files) and not c.bad
