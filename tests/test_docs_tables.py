"""The docs' current tables are what `sift report` renders from the committed results (docs/results/*.json): a
table edited by hand, or a result changed without re-rendering, fails here."""

import json
import shutil
from pathlib import Path

import pytest

from sift_cli.errors import SiftError
from sift_cli.lab.report.pages import marked_tables, update
from sift_cli.lab.report.published import TABLES
from sift_cli.lab.results import make_result

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_table_in_the_docs_is_what_its_result_renders():
    assert update(DOCS, check=True) == [], "run `make docs-tables` (sift report) and commit the pages"


def test_every_published_table_is_marked_in_a_page():
    marked = {name for names in marked_tables(DOCS).values() for name in names}
    assert set(TABLES) <= marked


def _prefill_result():
    base = {"model": "m", "pattern": "paper", "tokens": 8192, "protocol": "graphed", "baseline_protocol": "graphed"}
    rows = [{**base, "mode": "full", "ttft_ms": 100.0, "attention_share": 0.5},
            {**base, "mode": "no-attention", "ttft_ms": 50.0},
            {**base, "mode": "sift-cuda", "ttft_ms": 70.0, "speedup": 100 / 70, "allowed_density": 0.25,
             "cell_density": 0.3, "cells_over_allowed": 1.2, "ttft_over_ideal": 70 / 62.5,
             "ttft_over_ideal_computed": 70 / 65}]
    return make_result("bench-prefill", rows, {"timing": "graphed", "description": "all graphed"},
                       argv=["sift", "bench", "prefill", "--cuda-graphs"])


def test_a_result_renders_and_a_hand_edit_is_caught(tmp_path):
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    page = docs / "page.md"
    page.write_text("intro\n\n<!-- table:prefill-8b-graphed -->\nold\n<!-- /table:prefill-8b-graphed -->\nend\n")
    assert update(docs, check=True) == ["page.md"]
    update(docs)
    assert "Not yet re-measured" in page.read_text() and update(docs, check=True) == []
    (docs / "results" / TABLES["prefill-8b-graphed"].results[0]).write_text(json.dumps(_prefill_result()))
    assert update(docs, check=True) == ["page.md"]  # a new result: the table is stale until rendered
    update(docs)
    text = page.read_text()
    assert "| m | 8K | graphed | 100.0 | 50.0 | 50.0 % | sift-cuda | 70.0 | 1.43 |" in text
    assert "`sift bench prefill --cuda-graphs`" in text and "Protocol: all graphed." in text
    assert text.startswith("intro\n") and text.endswith("end\n")
    page.write_text(text.replace("| 70.0 |", "| 69.0 |"))  # a hand edit
    assert update(docs, check=True) == ["page.md"]
    longest = _prefill_result()  # the longest prompts, measured in a call of their own: rows of both, both named
    for r in longest["rows"]:
        r["tokens"] = 131072
    (docs / "results" / TABLES["prefill-8b-graphed"].results[1]).write_text(json.dumps(longest))
    update(docs)
    text = page.read_text()
    assert "| m | 8K | graphed |" in text and "| m | 128K | graphed |" in text
    assert all(f"results/{name}" in text for name in TABLES["prefill-8b-graphed"].results)


def test_an_unknown_marker_is_one_clear_error(tmp_path):
    (tmp_path / "p.md").write_text("<!-- table:nope -->\n<!-- /table:nope -->\n")
    with pytest.raises(SiftError, match="unknown table marker 'nope'"):
        update(tmp_path, check=True)


def test_the_committed_results_are_result_files():
    for path in sorted((DOCS / "results").glob("*.json")):
        obj = json.loads(path.read_text())
        assert {"kind", "command", "commit", "device", "versions", "protocol", "rows"} <= obj.keys(), path.name


def test_the_shipped_renderers_take_the_benches_rows(tmp_path):
    """Each renderer on a minimal result of its bench's row shape (the keys the benches write)."""
    kernels = make_result("bench-kernels", [
        dict(kind="attention", impl="cuDNN SDPA", layout="causal", H=32, H_kv=8, D=128, L=16384, block_n=None,
             density=1.0, timing="graph", ms=2.0, tflops=600.0),
        dict(kind="attention", impl="SIFT cuda", layout="7 docs of 300-3000", H=32, H_kv=8, D=128, L=16384,
             block_m=128, block_n=64, density=0.2, cells_over_allowed=1.1, timing="graph", ms=0.5, tflops=500.0,
             speedup_vs_flex=2.0),
        dict(kind="attention", impl="FlexAttention", layout="7 docs of 300-3000", H=32, H_kv=8, D=128, L=16384,
             block_m=128, block_n=64, density=0.2, cells_over_allowed=1.1, timing="graph", ms=1.0, tflops=250.0,
             agree=1e-3),
        dict(kind="decode", L=15360, layers=32, heads=32, ctas=132, timing="graph", ms_all_layers=0.5,
             ms_per_layer=0.5 / 32)])
    docs_table = TABLES["kernels-documents"].render(kernels)
    assert "| 32/8/128 | 16K | 7 docs of 300-3000 | 128×64 | 20 % | 1.100 | graph | 2.000 | 0.500 | 1.000 | 2.00 |" \
        in docs_table
    assert "| 32×32 | 15K | graph | 132 | 0.0156 | 0.500 |" in TABLES["decode"].render(kernels)
    TABLES["kernels-causal"].render(kernels)
    TABLES["profile"].render(make_result("bench-profile", [{"model": "m", "case": "nq", "docs": 3,
                                                            "mean_tokens": 100.0, "dense_tok_s": 1e5}]))
    TABLES["store"].render(make_result("bench-store", [{"documents": 10, "store": {"open_ms": 1.0},
                                                        "parquet": {"error": "x"}}]))
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_protocol_reads_as_words():
    from sift_cli.lab.report.pages import _protocol
    from sift_cli.timing import timing_protocol

    assert _protocol(timing_protocol(3, 1)) == "warm median, repeat 3, warmup 1"
    assert _protocol({"description": "graph replays", "repeat": 5}) == "graph replays"
    assert _protocol("eager") == "eager" and _protocol(None) == ""
