"""Prompts with documents the shard sets lack: dense documents in prompts (against the reference), on-the-fly
profiling (the same bits as `sift profile`), concurrent writers, and `sift profile` keeping added documents."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from sift_cli.attention.backends import get_backend
from sift_cli.attention.reference import ReferenceBackend
from sift_cli.block_lists import cell_density
from sift_cli.config import ProfileConfig
from sift_cli.corpus import Document, load_documents
from sift_cli.errors import SiftError
from sift_cli.prefill.assemble import NOT_PROFILED, TEXT_DIFFERS, assemble
from sift_cli.prefill.job import prefill_from_shards
from sift_cli.prefill.missing import profile_config_of
from sift_cli.prefill.options import PrefillOptions
from sift_cli.prefill.run import dense_prefill, sparse_prefill
from sift_cli.profile.additions import add_documents
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.ids import prompt_ids_report
from sift_cli.shards.reader import ShardSet
from sift_cli.shards.validate import validate_path

SPARSE = ProfileConfig(tile=16, alpha=2e-2, beta=5e-2, gamma=0.3)
IDS = ["doc03", "doc11", "doc05", "doc08", "doc07", "doc09"]


@pytest.fixture
def corpus_docs(small_corpus):
    return {d.doc_id: d for d in load_documents(small_corpus)}


@pytest.fixture
def full_set(tmp_path, tiny_lm, small_corpus):
    profile_corpus(small_corpus, tmp_path / "full", tiny_lm, SPARSE, num_shards=2)
    return ShardSet(tmp_path / "full")


@pytest.fixture
def partial_set(tmp_path, tiny_lm, small_corpus):
    """The same corpus without doc05 and doc08."""
    for name in ("doc05", "doc08"):
        (small_corpus / f"{name}.txt").rename(tmp_path / f"{name}.txt")
    profile_corpus(small_corpus, tmp_path / "partial", tiny_lm, SPARSE, num_shards=2)
    for name in ("doc05", "doc08"):
        (tmp_path / f"{name}.txt").rename(small_corpus / f"{name}.txt")
    return ShardSet(tmp_path / "partial")


def _kl(dense, sparse):
    p, q = torch.log_softmax(dense.double(), -1), torch.log_softmax(sparse.double(), -1)
    return float((p.exp() * (p - q)).sum())


def test_mixed_prompt_matches_the_reference_and_sits_between(tiny_lm, full_set, partial_set, corpus_docs):
    query = "What jumps over the dog?"
    profiled = assemble(full_set, tiny_lm, IDS, query)
    docs = [corpus_docs[i] if i in ("doc05", "doc08") else i for i in IDS]
    mixed = assemble(partial_set, tiny_lm, docs, query)
    assert mixed.input_ids == profiled.input_ids
    assert [(d.doc_id, d.reason) for d in mixed.dense] == [("doc05", NOT_PROFILED), ("doc08", NOT_PROFILED)]
    assert mixed.bits.dense_docs() == [2, 3] and profiled.bits.dense_docs() == []
    x = torch.tensor([profiled.input_ids])
    dense_logits = dense_prefill(tiny_lm, x).logits
    results = {}
    for name, prompt in (("profiled", profiled), ("mixed", mixed)):
        runs = [sparse_prefill(tiny_lm, prompt, be, x, PrefillOptions(block_m=128))  # one function, both backends
                for be in (ReferenceBackend(), get_backend("gather", tiny_lm.device))]
        assert torch.allclose(runs[0].logits, runs[1].logits, atol=1e-4, rtol=1e-5)  # gather == reference
        lists = runs[0].plan.block_lists
        results[name] = (sum(cell_density(b) for b in lists) / len(lists), _kl(dense_logits, runs[0].logits),
                         int(runs[0].logits.argmax()))
    (d_prof, kl_prof, tok_prof), (d_mixed, kl_mixed, tok_mixed) = results["profiled"], results["mixed"]
    assert d_prof < d_mixed < 1.0
    assert kl_mixed <= kl_prof + 1e-9
    assert tok_mixed == int(dense_logits.argmax()) or tok_prof != int(dense_logits.argmax())


def test_documents_as_text(tiny_lm, full_set, corpus_docs):
    same = assemble(full_set, tiny_lm, [corpus_docs["doc03"], "doc04"], "q?")
    assert same.dense == [] and same.bits.dense_docs() == []
    edited = Document("doc03", corpus_docs["doc03"].text + " And one more sentence.", "edited")
    changed = assemble(full_set, tiny_lm, [edited, "doc04"], "q?")
    assert [(d.doc_id, d.reason) for d in changed.dense] == [("doc03", TEXT_DIFFERS)]
    with pytest.raises(SiftError, match="not in the shard set .* no text was given"):
        assemble(full_set, tiny_lm, ["doc03", "unknown"], "q?")
    assert prompt_ids_report(full_set.dir, ["doc03", "x", "doc04", "x", "y"])["missing_ids"] == ["x", "y"]


def test_on_the_fly_bits_equal_sift_profile(tmp_path, tiny_lm, full_set, partial_set, corpus_docs):
    cfg = profile_config_of(partial_set, tiny_lm)
    out = tmp_path / "added"
    report = add_documents(out, [corpus_docs["doc08"], corpus_docs["doc05"]], tiny_lm, cfg,
                           partial_set.prefix_token_ids)
    assert sorted(report.added) == ["doc05", "doc08"] and not report.conflicts
    added = ShardSet(out)
    for got, want in zip(added.get(["doc05", "doc08"]), full_set.get(["doc05", "doc08"])):
        assert got.tokens == want.tokens and got.la_bits == want.la_bits and got.ca_bits == want.ca_bits
    assert not validate_path(out)["problems"]
    again = add_documents(out, [corpus_docs["doc05"]], tiny_lm, cfg, partial_set.prefix_token_ids)
    assert again.added == [] and again.present == ["doc05"]
    # into the set the corpus was profiled to; `sift profile` of the corpus then keeps the added rows
    add_documents(partial_set.dir, [Document("extra", "A document no corpus has.", "t")], tiny_lm, cfg,
                  partial_set.prefix_token_ids)
    assert "extra" in ShardSet(partial_set.dir)


def test_prefill_profiles_missing_documents_for_the_next_prompt(tmp_path, tiny_lm, tiny_ckpt, partial_set,
                                                                 full_set, corpus_docs):
    out = tmp_path / "fresh"
    docs = [corpus_docs["doc05"], "doc03", corpus_docs["doc08"]]
    opts = PrefillOptions(backend="reference", repeat=1, warmup=0, max_new_tokens=2)
    first = prefill_from_shards(partial_set.dir, docs, "q?", str(tiny_ckpt), "cpu", opts=opts, profile_missing=out)
    assert [d["doc_id"] for d in first["dense_docs"]] == ["doc05", "doc08"]
    assert 0 < first["density"]["dense_docs_cells_share"] <= 1
    assert sorted(first["profiled_missing"]["added"]) == ["doc05", "doc08"]
    second = prefill_from_shards(partial_set.dir, docs, "q?", str(tiny_ckpt), "cpu", opts=opts, profile_missing=out)
    assert second["dense_docs"] == [] and second["profiled_missing"]["added"] == []
    assert second["density"]["cells"] < first["density"]["cells"]
    assert ShardSet(out).get(["doc05"])[0].la_bits == full_set.get(["doc05"])[0].la_bits


def test_adding_keeps_what_the_bucket_skipped_and_its_reason(tmp_path, tiny_lm, small_corpus):
    (small_corpus / "blank.txt").write_text("   \n")
    profile_corpus(small_corpus, tmp_path / "one", tiny_lm, SPARSE, num_shards=1)
    before = ShardSet(tmp_path / "one").skip_reason("blank")
    assert before is not None
    first = ShardSet(tmp_path / "one")
    manifest = tmp_path / "one" / "manifest.parquet"
    add_documents(first.dir, [Document("fresh", "A new document.", "t")], tiny_lm,
                  profile_config_of(first, tiny_lm), first.prefix_token_ids)
    after = ShardSet(tmp_path / "one")
    assert "fresh" in after and after.skip_reason("blank") == before
    stamp = manifest.stat().st_mtime_ns
    again = add_documents(first.dir, [Document("fresh", "A new document.", "t")], tiny_lm,
                          profile_config_of(first, tiny_lm), first.prefix_token_ids)
    assert again.present == ["fresh"] and manifest.stat().st_mtime_ns == stamp  # nothing written, nothing rewritten


def test_profile_corpus_keeps_added_documents(tmp_path, tiny_lm, small_corpus, partial_set):
    cfg = profile_config_of(partial_set, tiny_lm)
    add_documents(partial_set.dir, [Document("zz-added", "Some words nobody profiled.", "t")], tiny_lm, cfg,
                  partial_set.prefix_token_ids)
    rerun = profile_corpus(small_corpus, partial_set.dir, tiny_lm, SPARSE, num_shards=2)  # doc05/doc08 are back
    assert rerun.shards_written >= 1  # the buckets of doc05 and doc08 are profiled again
    now = ShardSet(partial_set.dir)
    assert "zz-added" in now and "doc05" in now and not validate_path(partial_set.dir)["problems"]


WRITER = textwrap.dedent("""
    import json, sys
    from sift_cli.corpus import Document
    from sift_cli.models import load_model
    from sift_cli.prefill.missing import profile_config_of
    from sift_cli.profile.additions import add_documents
    from sift_cli.shards.reader import ShardSet
    ckpt, base, out, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    lm = load_model(ckpt, device="cpu")
    s = ShardSet(base)
    docs = [Document(n, f"Document {n}: " + " ".join(["words about foxes and dogs"] * (5 + len(n))), n)
            for n in names]
    print(json.dumps(add_documents(out, docs, lm, profile_config_of(s, lm), s.prefix_token_ids).to_json()))
""")


def test_concurrent_writers_leave_a_valid_set(tmp_path, tiny_ckpt, full_set):
    out = tmp_path / "shared"
    names = [[f"a{i}" for i in range(10)] + ["both1", "both2"], [f"b{i}" for i in range(10)] + ["both1", "both2"]]
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tiny_ckpt), str(full_set.dir), str(out),
                               ",".join(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in names]
    reports = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-2000:]
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    assert not validate_path(out)["problems"]
    got = ShardSet(out)
    assert sorted(got.doc_ids()) == sorted(set(names[0]) | set(names[1]))
    added_both = sorted(reports[0]["added"] + reports[1]["added"])
    assert added_both.count("both1") == 1 and added_both.count("both2") == 1  # one writer profiled each


def test_prefill_cli_reads_documents_as_files_and_jsonl(tmp_path, tiny_ckpt, partial_set, corpus_docs, capsys):
    from .cli.test_cli import assert_one_line_error, run

    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "doc05.txt").write_text((tmp_path / "corpus" / "doc05.txt").read_text())
    docs, query = tmp_path / "docs.txt", tmp_path / "q.txt"
    docs.write_text("doc03\nnew/doc05.txt\ndoc07\n")
    query.write_text("What does the fox do?\n")
    out = tmp_path / "added"
    args = ["prefill", "--shards", partial_set.dir, "--docs", docs, "--query", query, "--model", tiny_ckpt,
            "--backend", "reference", "--repeat", "1", "--max-new-tokens", "2", "--profile-missing", out]
    code, stdout, err = run(capsys, *args, "--json")
    assert code == 0, err
    r = json.loads(stdout)
    assert r["doc_ids"] == ["doc03", "doc05", "doc07"] and r["dense_docs"][0]["doc_id"] == "doc05"
    assert r["profiled_missing"]["added"] == ["doc05"] and "doc05" in ShardSet(out)
    code, stdout, _ = run(capsys, *args)  # now profiled: read from the added set
    assert code == 0 and "dense documents" not in stdout and "profiled for the next prompt: 0" in stdout

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"id": "doc03"}) + "\n" + json.dumps({"id": "fresh", "text": "Foxes nap."}) + "\n")
    code, stdout, _ = run(capsys, *[jsonl if a == docs else a for a in args])
    assert code == 0 and "dense documents: fresh (not profiled)" in stdout
    docs.write_text("doc03\nnowhere/x.txt\n")
    code, _, err = run(capsys, *args)
    assert_one_line_error(code, err, "document file 'nowhere/x.txt' not found")
    docs.write_text("doc03\nunknown-id\n")
    code, _, err = run(capsys, *args)
    assert_one_line_error(code, err, "'unknown-id' is not in", "no text was given")


def test_ids_and_status_say_which_prompt_ids_are_missing(tmp_path, partial_set, capsys):
    from .cli.test_cli import run

    docs = tmp_path / "prompt.jsonl"
    docs.write_text("\n".join(json.dumps(r) for r in [{"id": "doc03"}, {"id": "doc05", "text": "Foxes."},
                                                      {"id": "doc08"}, {"id": "doc03"}]) + "\n")
    code, stdout, err = run(capsys, "ids", partial_set.dir, "--docs", docs)
    assert code == 0, err
    assert [ln.split("\t")[:2] for ln in stdout.strip().splitlines()] == [["doc03", "profiled"], ["doc05", "absent"],
                                                                          ["doc08", "absent"]]
    assert "2 of the 3 ids the prompt names are missing" in err and "1 given as text" in err
    code, stdout, _ = run(capsys, "ids", partial_set.dir, "--docs", docs, "--json")
    p = json.loads(stdout)["prompt"]
    assert (p["named"], p["missing"], p["missing_ids"], p["with_text"]) == (3, 2, ["doc05", "doc08"], ["doc05"])
    code, stdout, _ = run(capsys, "status", partial_set.dir, "--docs", docs)
    assert code == 0 and "2 of the 3 ids the prompt names are missing" in stdout and "doc05, doc08" in stdout
    code, stdout, _ = run(capsys, "status", partial_set.dir, "--docs", docs, "--json")
    assert json.loads(stdout)["prompt"]["missing"] == 2
