"""The mass rule: its bits against a brute-force fp64 reference (every row drops ≤ ε, every head's CA pages ≤ ε'
of the mean later-query mass, and no tile or page more than the rows need), its metadata through shards, store and
inspect, and the refusals of mixed rules."""

import json

import pytest
import torch

from sift_cli.config import ProfileConfig, resolve_profile_config, rule_of
from sift_cli.errors import SiftError
from sift_cli.profile.mass_rule import fewest_kept
from sift_cli.profile.statistics import doc_attention_bits

from ..cli.test_cli import assert_one_line_error, run

EPS, CA_EPS = 0.05, 0.1


def _reference(q, k, prefix, n, scale, T, eps, ca_eps):
    """fp64, row by row: each row's greedy tiles, their union per tile row, and the CA pages per head."""
    H = q.shape[0]
    group = H // k.shape[0]
    P = -(-n // T)
    S = prefix + n
    kk = k[torch.arange(H) // group, :S].double()
    scores = torch.einsum("hid,hjd->hij", q[:, prefix:S].double(), kk) * scale
    causal = torch.arange(S)[None, :] <= (prefix + torch.arange(n))[:, None]
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)[:, :, prefix:]  # [H, n, n]
    la = torch.zeros(H, P, P, dtype=torch.bool)
    needs = {}
    for h in range(H):
        for i in range(n):
            mass = [float(probs[h, i, c * T:(c + 1) * T].sum()) for c in range(P)]
            diag = i // T
            others = sorted((c for c in range(diag)), key=lambda c: -mass[c])
            rest, chosen = sum(mass[c] for c in others), []
            for c in others:
                if rest <= eps:
                    break
                chosen.append(c)
                rest -= mass[c]
            needs[h, i] = set(chosen)
            la[h, diag, diag] = True
            for c in chosen:
                la[h, diag, c] = True
    mean = probs.sum(1) / (n - torch.arange(n)).double()  # [H, n]
    pages = torch.stack([mean[:, c * T:(c + 1) * T].sum(-1) for c in range(P)], -1)  # [H, P]
    ca = torch.zeros(H, P, dtype=torch.bool)
    for h in range(H):
        total, rest = float(pages[h].sum()), float(pages[h].sum())
        for c in sorted(range(P), key=lambda c: -float(pages[h, c])):
            if rest <= ca_eps * total:
                break
            ca[h, c] = True
            rest -= float(pages[h, c])
    return probs, la, ca, needs, pages


@pytest.mark.parametrize("n,T,budget", [(70, 16, 1 << 30), (100, 16, 40_000), (33, 32, 1 << 30)])
def test_mass_bits_match_the_brute_force_reference(n, T, budget):
    torch.manual_seed(n)
    H, Hkv, prefix, D = 4, 2, 5, 8
    q, k = torch.randn(H, prefix + n + 3, D) * 2, torch.randn(Hkv, prefix + n + 3, D) * 2  # 3 padding rows
    cfg = ProfileConfig(tile=T, rule="mass", epsilon=EPS, ca_epsilon=CA_EPS, stats_budget_bytes=budget)
    la, ca = doc_attention_bits(q, k, prefix, n, D ** -0.5, cfg)
    probs, ref_la, ref_ca, needs, pages = _reference(q, k, prefix, n, D ** -0.5, T, EPS, CA_EPS)
    assert torch.equal(la, ref_la) and torch.equal(ca, ref_ca)
    P = la.shape[-1]
    for h in range(H):
        for i in range(n):  # every row drops at most ε (its prefix and diagonal tile are computed)
            kept = la[h, i // T].repeat_interleave(T)[:n]
            assert float(probs[h, i][~kept].sum()) <= EPS + 1e-9
        # minimal: every off-diagonal tile set is one some row of its tile row needs; each row's set is the
        # fewest tiles meeting the bound (greedy heaviest-first, in the reference)
        for r in range(P):
            for c in range(r):
                if la[h, r, c]:
                    assert any(c in needs[h, i] for i in range(r * T, min(n, (r + 1) * T)))
        dropped = float(pages[h][~ca[h]].sum())
        assert dropped <= CA_EPS * float(pages[h].sum()) + 1e-9
        if ca[h].any():  # one page fewer (the lightest kept) would drop too much
            lightest = float(pages[h][ca[h]].min())
            assert dropped + lightest > CA_EPS * float(pages[h].sum())


def test_fewest_kept_is_the_smallest_set():
    mass = torch.tensor([[0.1, 0.5, 0.05, 0.3, 0.05], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert fewest_kept(mass, 0.12).tolist() == [[True, True, False, True, False], [False] * 5]
    assert fewest_kept(mass, 0.0).tolist()[0] == [True] * 5
    assert fewest_kept(mass, torch.tensor([[0.25], [0.0]])).tolist()[0] == [False, True, False, True, False]


def test_epsilon_zero_keeps_every_causal_tile_with_mass():
    torch.manual_seed(1)
    q, k = torch.randn(2, 60, 8), torch.randn(2, 60, 8)
    la, ca = doc_attention_bits(q, k, 4, 56, 8 ** -0.5, ProfileConfig(tile=16, rule="mass", epsilon=0.0,
                                                                      ca_epsilon=0.0))
    assert torch.equal(la, torch.ones_like(la).tril().expand_as(la)) and ca.all()


def test_rule_parameters_are_checked():
    with pytest.raises(SiftError, match="--epsilon belongs to --rule mass"):
        resolve_profile_config("cpu", {"epsilon": 0.1})
    with pytest.raises(SiftError, match="--alpha belongs to --rule paper"):
        resolve_profile_config("cpu", {"rule": "mass", "alpha": 0.1})
    with pytest.raises(SiftError, match="--rule bogus"):
        resolve_profile_config("cpu", {"rule": "bogus"})
    with pytest.raises(SiftError, match="--stats torch"):
        resolve_profile_config("cpu", {"rule": "mass", "stats": "triton"})
    with pytest.raises(SiftError, match="--epsilon 1.0"):
        resolve_profile_config("cpu", {"rule": "mass", "epsilon": 1.0})
    cfg = resolve_profile_config("cpu", {"rule": "mass", "epsilon": 0.01}).profile
    assert cfg.thresholds() == {"tile_size": 64, "rule": "mass", "epsilon": 0.01, "ca_epsilon": 0.05}
    assert ProfileConfig().thresholds() == {"tile_size": 64, "alpha": 1e-3, "beta": 1e-2, "gamma": 0.1}


def test_mass_metadata_round_trips(tmp_path, tiny_ckpt, tiny_lm, small_corpus, capsys):
    from sift_cli.prefill.lookup import open_set
    from sift_cli.prefill.missing import profile_config_of

    out = tmp_path / "mass"
    code, _, err = run(capsys, "profile", small_corpus, "--out", out, "--model", tiny_ckpt, "--tile", "16",
                       "--rule", "mass", "--epsilon", "0.03", "--ca-epsilon", "0.2", "--num-shards", "2")
    assert code == 0, err
    header = json.loads((out / "store" / "set.json").read_text())["meta"]
    assert (header["sift.rule"], header["sift.epsilon"], header["sift.ca_epsilon"]) == ("mass", 0.03, 0.2)
    assert header["sift.alpha"] is None
    shards = open_set(out)
    assert rule_of(shards.meta) == {"tile": 16, "rule": "mass", "epsilon": 0.03, "ca_epsilon": 0.2}
    cfg = profile_config_of(shards, tiny_lm)
    assert (cfg.rule, cfg.epsilon, cfg.ca_epsilon, cfg.tile) == ("mass", 0.03, 0.2, 16)
    code, stdout, _ = run(capsys, "inspect", out, "--json")
    s = json.loads(stdout)
    assert code == 0 and (s["rule"], s["epsilon"], s["ca_epsilon"]) == ("mass", 0.03, 0.2)
    code, stdout, _ = run(capsys, "inspect", out)
    assert "rule mass  ε=0.03  ε'=0.2" in stdout
    code, stdout, _ = run(capsys, "validate", out, "--json")
    assert code == 0 and json.loads(stdout)["ok"]
    docs, query = tmp_path / "ids.txt", tmp_path / "q.txt"
    docs.write_text("doc03\ndoc07\n")
    query.write_text("Why?\n")
    code, stdout, _ = run(capsys, "prefill", "--shards", out, "--docs", docs, "--query", query, "--model", tiny_ckpt,
                          "--backend", "reference", "--max-new-tokens", "1", "--no-noise-floor", "--json")
    assert code == 0 and json.loads(stdout)["selection"] == {"tile": 16, "rule": "mass", "epsilon": 0.03,
                                                             "ca_epsilon": 0.2}
    code, stdout, _ = run(capsys, "prefill", "--shards", out, "--docs", docs, "--query", query, "--model", tiny_ckpt,
                          "--backend", "reference", "--max-new-tokens", "1", "--no-noise-floor")
    assert code == 0 and "mass rule ε=0.03 ε'=0.2" in stdout
    # a paper set made before the rule existed reads as the paper rule
    assert rule_of({"sift.tile_size": 64, "sift.alpha": 1e-3, "sift.beta": 1e-2, "sift.gamma": 0.1})["rule"] == "paper"


def test_a_set_refuses_documents_of_another_rule(tmp_path, tiny_ckpt, tiny_lm, small_corpus, capsys):
    from sift_cli.corpus import Document
    from sift_cli.profile.additions import add_documents
    from sift_cli.profile.job import profile_corpus
    from sift_cli.shards.reader import ShardSet

    paper = tmp_path / "paper"
    profile_corpus(small_corpus, paper, tiny_lm, ProfileConfig(tile=16), num_shards=2)
    code, _, err = run(capsys, "profile", small_corpus, "--out", paper, "--model", tiny_ckpt, "--tile", "16",
                       "--rule", "mass")
    assert_one_line_error(code, err, "different rule")
    mass_cfg = ProfileConfig(tile=16, rule="mass")
    with pytest.raises(SiftError, match="different rule"):
        add_documents(paper, [Document("new", "A new document.", "t")], tiny_lm, mass_cfg,
                      ShardSet(paper).prefix_token_ids)
    mass = tmp_path / "mass"
    profile_corpus(small_corpus, mass, tiny_lm, mass_cfg, num_shards=2)
    with pytest.raises(SiftError, match="different rule"):
        add_documents(mass, [Document("new", "A new document.", "t")], tiny_lm, ProfileConfig(tile=16),
                      ShardSet(mass).prefix_token_ids)
    added = add_documents(mass, [Document("new", "A new document.", "t")], tiny_lm, mass_cfg,
                          ShardSet(mass).prefix_token_ids)
    assert added.added == ["new"] and ShardSet(mass).meta["sift.rule"] == "mass"
