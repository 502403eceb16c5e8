"""The numeric noise floor beside SIFT's KL: the reference run, the multiple and verdict, the report and the CLI."""

import json

import pytest
import torch

from sift_cli.config import ProfileConfig
from sift_cli.prefill.assemble import assemble
from sift_cli.prefill.noise import (NEAR, WITHIN, kl_multiple, parameters_in, reference_dtype, reference_run,
                                   verdict)
from sift_cli.prefill.options import PrefillOptions
from sift_cli.prefill.report import compare_logits, run_prefill
from sift_cli.prefill.run import dense_prefill
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.reader import ShardSet

from .cli.test_cli import run


@pytest.fixture
def paper_set(tmp_path, tiny_lm, small_corpus):
    out = tmp_path / "set"
    profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=16), num_shards=2)
    return out


def test_reference_precision_per_serving_dtype():
    assert reference_dtype(torch.bfloat16) == torch.float32
    assert reference_dtype(torch.float16) == torch.float32
    assert reference_dtype(torch.float32) == torch.bfloat16


def test_parameters_come_back_bit_exact(tiny_lm):
    before = {n: p.detach().clone() for n, p in tiny_lm.model.named_parameters()}
    with parameters_in(tiny_lm.model, torch.bfloat16):
        assert all(p.dtype == torch.bfloat16 for p in tiny_lm.model.parameters())
    for n, p in tiny_lm.model.named_parameters():
        assert p.dtype == before[n].dtype and torch.equal(p, before[n]), n


def test_reference_run_is_the_reference_precision(tiny_lm):
    ids = torch.tensor([list(range(5, 60))])
    served = dense_prefill(tiny_lm, ids).logits
    ref, tokens, name = reference_run(tiny_lm, ids, 3)
    assert name == "bfloat16" and len(tokens) >= 1
    kl = compare_logits(served, ref)["kl"]
    assert 0 < kl < 1e-1  # bf16 moves the logits a little, not a lot
    assert torch.equal(dense_prefill(tiny_lm, ids).logits, served)  # the served model is unchanged


def test_multiple_and_verdict():
    assert kl_multiple(0.0, 0.0) == 0.0 and kl_multiple(1e-3, 0.0) is None
    assert kl_multiple(4e-3, 2e-3) == 2.0
    assert verdict(WITHIN) == "within" and verdict(WITHIN + 0.1) == "near"
    assert verdict(NEAR) == "near" and verdict(NEAR + 0.1) == "above" and verdict(None) == "above"


def test_report_holds_the_noise_floor_unless_turned_off(tiny_lm, paper_set):
    prompt = assemble(ShardSet(paper_set), tiny_lm, ["doc03", "doc07"], "What does the fox do?")
    opts = PrefillOptions(backend="reference", repeat=1, warmup=0, max_new_tokens=3)
    r = run_prefill(tiny_lm, prompt, opts)
    floor = r["noise_floor"]
    assert floor["reference_dtype"] == "bfloat16" and floor["kl"] > 0
    assert r["kl_over_noise"] == pytest.approx(r["kl"] / floor["kl"])
    assert floor["verdict"] == verdict(r["kl_over_noise"])
    assert isinstance(floor["same_answer"], bool) and isinstance(floor["first_token_match"], bool)
    off = run_prefill(tiny_lm, prompt, PrefillOptions(backend="reference", repeat=1, warmup=0, max_new_tokens=3,
                                                      noise_floor=False))
    assert "noise_floor" not in off and "kl_over_noise" not in off


def test_cli_prints_the_noise_line_and_json(tmp_path, tiny_ckpt, paper_set, capsys):
    docs, query = tmp_path / "ids.txt", tmp_path / "q.txt"
    docs.write_text("doc03\ndoc07\n")
    query.write_text("Why?\n")
    base = ["prefill", "--shards", paper_set, "--docs", docs, "--query", query, "--model", tiny_ckpt,
            "--backend", "reference", "--max-new-tokens", "1"]
    code, stdout, _ = run(capsys, *base)
    assert code == 0 and "the numeric noise" in stdout and "within ≤ 2×" in stdout
    code, stdout, _ = run(capsys, *base, "--json", "--no-noise-floor")
    assert code == 0 and "noise_floor" not in json.loads(stdout)
