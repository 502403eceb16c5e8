"""QA pieces: answer scoring, records, the summary."""

import json

import pytest

from sift_cli.errors import SiftError
from sift_cli.lab.eval.qa import answer_correct, normalize_answer, summarize_qa
from sift_cli.lab.eval.qa_records import ctx_id, read_qa_records, records_prompt_set, truncate_ctxs


def test_lost_in_the_middle_scoring():
    assert normalize_answer("The  Wilhelm Conrad Röntgen!") == "wilhelm conrad röntgen"
    assert answer_correct("It was Wilhelm Conrad Röntgen, in 1901.", ["Wilhelm Conrad Röntgen"])
    assert answer_correct("an apple", ["The Apple"])
    assert not answer_correct("Marie Curie", ["Wilhelm Conrad Röntgen", "Röntgen"])
    assert not answer_correct("anything", ["", "  "])  # empty gold answers never match

def _rec(i, n=4, gold=2):
    return {"question": f"q{i}?", "answers": [f"a{i}"],
            "ctxs": [{"title": f"t{j}", "text": f"text {i}-{j}", "isgold": j == gold} for j in range(n)]}

def test_records_io_truncation_and_dedupe(tmp_path):
    p = tmp_path / "r.jsonl"
    recs = [_rec(0), _rec(1)]
    recs[1]["ctxs"][0] = dict(recs[0]["ctxs"][0])  # a context shared by two questions
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    got = read_qa_records(p)
    assert len(got) == 2
    lst = tmp_path / "r.json"
    lst.write_text(json.dumps(recs))
    assert read_qa_records(lst) == got
    ps = records_prompt_set(got, "t")
    assert len(ps.used_docs()) == 7 and ps.prompts[0].doc_ids[0] == ps.prompts[1].doc_ids[0]
    assert ps.docs[ctx_id(recs[0]["ctxs"][1])].text == "Title: t1\ntext 0-1\n\n"
    short = truncate_ctxs(_rec(5, n=6, gold=4), 3)
    assert len(short) == 3 and short[-1]["isgold"]
    assert truncate_ctxs(_rec(5, n=6, gold=1), 3)[1]["isgold"]
    for bad, msg in (('{"question": "q"}', "expected"), ("{nope", "invalid JSON"),
                     ('{"question": "q", "answers": [], "ctxs": [{"text": "x"}]}', "answers"),
                     ('{"question": "q", "answers": ["a"], "ctxs": [{"text": ""}]}', "non-empty")):
        f = tmp_path / "bad.jsonl"
        f.write_text(bad + "\n")
        with pytest.raises(SiftError, match=msg):
            read_qa_records(f)
    with pytest.raises(SiftError, match="not found"):
        read_qa_records(tmp_path / "missing.jsonl")

def test_qa_summary():
    def item(correct, same, first, kl):
        return {"modes": {"full": {"correct": True, "same_as_full": True, "first_token_same": True, "kl": 0.0,
                                   "ttft_ms": 10.0},
                          "sift": {"correct": correct, "same_as_full": same, "first_token_same": first, "kl": kl,
                                   "ttft_ms": 5.0, "cell_density": 0.5}}}

    s = summarize_qa([item(True, True, True, 0.1), item(False, False, True, 0.3)], ("full", "sift"))
    assert s["sift"]["accuracy"] == 0.5 and s["sift"]["first_token_agreement"] == 1.0
    assert s["sift"]["kl_mean"] == pytest.approx(0.2) and s["sift"]["accuracy_minus_full"] == -0.5
    assert s["sift"]["cell_density_mean"] == 0.5
