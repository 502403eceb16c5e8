"""`sift eval frontier` on the CPU (a tiny model, a few prompts of fake data in the real layout), the mass-rule
grid's bits against `sift profile --rule mass`'s, and the comparison of two rules' frontiers."""

import gzip
import json

import pytest
import torch

from sift_cli.config import ProfileConfig
from sift_cli.lab.eval.frontier import compare_rules
from sift_cli.lab.eval.mass_grid import collect_mass_bits
from sift_cli.profile.forward import profile_batch
from sift_cli.tokens import prefix_token_ids

from ...cli.test_eval import assert_png, plot_args, run
from ...helpers import TRAINING_TEXT


def _fake_data(root):
    essays = root / "paul-graham-essays"
    essays.mkdir(parents=True)
    words = " ".join(TRAINING_TEXT).split()
    for i in range(4):
        (essays / f"e{i}.txt").write_text(" ".join(words[i * 7: i * 7 + 30]))
    with gzip.open(root / "nq-open-oracle.jsonl.gz", "wt") as f:
        for i in range(14):
            text = " ".join(" ".join(TRAINING_TEXT).split()[i * 5: i * 5 + 12])
            f.write(json.dumps({"question": f"what is thing {i}", "answers": [f"thing {i}"],
                                "ctxs": [{"title": f"T{i}", "text": text}]}) + "\n")
    return root


def test_mass_grid_bits_are_the_profiles(tiny_lm):
    docs = [list(range(5, 45)), list(range(50, 120))]
    prefix = prefix_token_ids(tiny_lm.tokenizer)
    grid = collect_mass_bits(tiny_lm.model, prefix, docs, 16, (0.01, 0.1), (0.05, 0.3))
    for e, ce in ((0, 1), (1, 0)):
        cfg = ProfileConfig(tile=16, rule="mass", epsilon=(0.01, 0.1)[e], ca_epsilon=(0.05, 0.3)[ce])
        for bits, (la, ca) in zip(profile_batch(tiny_lm.model, prefix, docs, cfg), grid):
            assert torch.equal(bits.la_tiles, la[e]) and torch.equal(bits.ca_pages, ca[ce])


def _pt(rule, density, kl, **params):
    return {"rule": rule, "tile_size": 64, "density": density, "kl_median": kl, **params}


def test_compare_rules():
    paper = [_pt("paper", 0.9, 1e-3, alpha=1e-4, beta=1e-3, gamma=0.03),
             _pt("paper", 0.7, 1e-2, alpha=1e-3, beta=1e-2, gamma=0.1)]
    mass = [_pt("mass", 0.6, 4e-3, epsilon=0.02, ca_epsilon=0.05), _pt("mass", 0.75, 1.5e-3, epsilon=0.01,
                                                                        ca_epsilon=0.02)]
    c = compare_rules(paper, mass, noise_median=1e-3)
    assert c["at_paper_default"]["kl_ratio"] == 0.4 and c["at_paper_default"]["met"]
    w = c["within_noise"]
    assert w["mass_density"] == 0.75 and w["paper_density_for_same_kl"] == 0.9 and w["met"] and c["mass_dominates"]
    c = compare_rules(paper, [_pt("mass", 0.75, 5e-4, epsilon=0.01, ca_epsilon=0.02)], noise_median=1e-3)
    w = c["within_noise"]  # the paper rule never gets there: its densest point bounds the gap from below
    assert not w["paper_reaches_that_kl"] and w["density_gap"] == pytest.approx(0.15) and w["met"]
    c = compare_rules(paper, [_pt("mass", 0.85, 5e-4, epsilon=0.01, ca_epsilon=0.02)], noise_median=1e-3)
    assert not c["within_noise"]["met"]
    c = compare_rules(paper, [_pt("mass", 0.6, 8e-3, epsilon=0.02, ca_epsilon=0.05)], noise_median=1e-3)
    assert not c["at_paper_default"]["met"] and c["within_noise"]["mass_point"] is None and not c["mass_dominates"]


def test_frontier_cpu_smoke(capsys, tmp_path, tiny_ckpt):
    data = _fake_data(tmp_path / "data")
    args = ["eval", "frontier", "--sets", "essays,nq10,pairs", "--n-prompts", "2", "--essay-words", "25",
            "--paper-points", "16,0.001,0.01,0.1;16,0.05,0.2,0.5", "--mass-points", "0.01,0.02;0.2,0.3",
            "--tile", "16", "--model", tiny_ckpt, "--device", "cpu", "--backend", "reference", "--max-new-tokens",
            "2", "--data-dir", data]
    code, out, e = run(capsys, *args, "--json", "--save", tmp_path / "f.json", *plot_args(tmp_path / "f.png"))
    assert code == 0, e
    res = json.loads(out)
    assert [r["set"] for r in res["sets"]] == ["essays", "nq10", "pairs"]
    for r in res["sets"]:
        assert r["prompt_set"]["prompts"] == 2 and r["noise_floor"]["kl_median"] > 0
        assert [p["epsilon"] for p in r["rules"]["mass"]] == [0.01, 0.2]
        for p in r["rules"]["paper"] + r["rules"]["mass"]:
            assert 0 < p["density"] <= 1 and p["kl_p90"] >= p["kl_median"] >= 0 and p["n"] == 2
        # a looser bound computes no more
        assert r["rules"]["mass"][1]["density"] <= r["rules"]["mass"][0]["density"] + 1e-9
        assert "within_noise" in r["comparison"]
    assert json.loads((tmp_path / "f.json").read_text())["sets"]
    assert_png(tmp_path / "f.png")
    code, out, _ = run(capsys, *args[:-2], "--data-dir", data, "--sets", "nq10")
    assert code == 0 and "noise floor" in out and "ε=0.01 ε'=0.02" in out
