"""The real bundled model: profile bits equal the brute-force reference from its eager attention."""

import pytest

from sift_cli.config import ProfileConfig
from sift_cli.profile.forward import profile_batch
from sift_cli.sample import sample_documents
from sift_cli.tokens import prefix_token_ids

from .helpers import brute_force_bits, eager_attentions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(smol_cpu):
    return smol_cpu


@pytest.fixture(scope="module")
def text_tokens(smol):
    text = " ".join(t for _, t in sample_documents())
    return smol.tokenizer(text, add_special_tokens=False)["input_ids"]


# one long document at the default tile; the other tiles at lengths of many pages (25 of 16, 4 and a part of 128)
# but under half the cost of a forward with statistics at 1,000 tokens
@pytest.mark.parametrize("tile,n", [(64, 1), (64, 63), (64, 64), (64, 65), (16, 15), (16, 17), (128, 129),
                                    pytest.param(64, 1000, marks=pytest.mark.heavy), (16, 400), (128, 520)])
def test_bits_equal_brute_force(smol, text_tokens, tile, n):
    prefix = prefix_token_ids(smol.tokenizer)
    doc = text_tokens[3000: 3000 + n]
    cfg = ProfileConfig(tile=tile)
    got = profile_batch(smol.model, prefix, [doc], cfg)[0]
    for layer, A in enumerate(eager_attentions(smol.model, prefix + doc)):
        la, ca = brute_force_bits(A, len(prefix), n, tile, cfg.alpha, cfg.beta, cfg.gamma)
        assert (got.la_tiles[layer].numpy() == la).all(), f"LA differs at layer {layer}"
        assert (got.ca_pages[layer].numpy() == ca).all(), f"CA differs at layer {layer}"


def test_model_facts(smol):
    assert (smol.n_layers, smol.n_heads, smol.n_kv_heads, smol.head_dim, smol.max_context) == (30, 9, 3, 64, 8192)
    assert smol.fingerprint.startswith("sha256:b179c952")
    assert smol.tokenizer.decode(prefix_token_ids(smol.tokenizer)).endswith("<|im_start|>user\n")


def _nq_or_skip():
    from sift_cli.errors import SiftError
    from sift_cli.lab.datasets import data_dir, nq_records

    try:
        return nq_records(data_dir())
    except SiftError:
        pytest.skip("NQ data not available (set SIFT_DATA_DIR)")


def test_nq_five_documents_same_first_token(smol, tmp_path):
    """A 5-passage NQ prompt: SIFT at the default thresholds gives the same first token as full recompute."""
    from sift_cli.lab.datasets import nq_items, nq_passages, write_jsonl
    from sift_cli.prefill.assemble import assemble
    from sift_cli.prefill.options import PrefillOptions
    from sift_cli.prefill.report import run_prefill
    from sift_cli.profile.job import profile_corpus
    from sift_cli.shards.reader import ShardSet

    records = _nq_or_skip()
    item = nq_items(records, n_docs=5, n_items=1, seed=3)[0]
    passages = {p["id"]: p for p in nq_passages(records)}
    corpus = write_jsonl([passages[d] for d in item.doc_ids], tmp_path / "nq.jsonl")
    profile_corpus(corpus, tmp_path / "shards", smol, ProfileConfig(), num_shards=1)
    prompt = assemble(ShardSet(tmp_path / "shards"), smol, list(item.doc_ids), item.question)
    opts = PrefillOptions(backend="gather", repeat=1, max_new_tokens=8, warmup=0, noise_floor=False)  # agreement only
    r = run_prefill(smol, prompt, opts)
    assert r["first_token_match"], r
    assert r["kl"] < 0.05 and 0 < r["density"]["blocks"] <= 1
    assert 1.0 <= r["density"]["cells_over_allowed"] < 1.05  # real profiles, document-aligned blocks
    for key in ("prompt_tokens", "density", "speedup", "decode_ms", "first_token_match", "kl"):
        assert key in r


def test_all_bits_set_equals_dense_logits(smol, tmp_path):
    """Profiled with α = β = γ = 0 every block is computed: SIFT's logits equal dense ones to fp32 rounding."""
    import torch

    from sift_cli.attention.reference import ReferenceBackend
    from sift_cli.lab.datasets import write_jsonl
    from sift_cli.prefill.assemble import assemble
    from sift_cli.prefill.options import PrefillOptions
    from sift_cli.prefill.run import dense_prefill, sparse_prefill
    from sift_cli.profile.job import profile_corpus
    from sift_cli.shards.reader import ShardSet

    docs = [{"id": name, "title": "", "text": text[:700]} for name, text in sample_documents()[:3]]
    corpus = write_jsonl(docs, tmp_path / "c.jsonl")
    profile_corpus(corpus, tmp_path / "s", smol, ProfileConfig(alpha=0.0, beta=0.0, gamma=0.0), num_shards=1)
    prompt = assemble(ShardSet(tmp_path / "s"), smol, [d["id"] for d in docs], "Which module reads CSV files?")
    ids = torch.tensor([prompt.input_ids])
    dense = dense_prefill(smol, ids).logits
    run = sparse_prefill(smol, prompt, ReferenceBackend(), ids, PrefillOptions())
    assert all(lay.density() == 1.0 for lay in run.plan.block_lists)
    assert float((dense - run.logits).abs().max()) < 1e-4  # fp32 rounding (measured: 0.0)
    assert int(dense.argmax()) == int(run.logits.argmax())


@pytest.mark.heavy
def test_nq_one_unprofiled_passage_among_ten(smol, tmp_path):
    """An 11-passage NQ prompt whose middle passage no shard set holds (given as text): it runs, its density lies
    between the all-profiled prompt's and 1, and it agrees with full recompute at least as well (first token,
    KL) as the all-profiled prompt."""
    from sift_cli.corpus import load_documents
    from sift_cli.lab.datasets import nq_items, nq_passages, write_jsonl
    from sift_cli.prefill.assemble import NOT_PROFILED, assemble
    from sift_cli.prefill.missing import profile_config_of
    from sift_cli.prefill.options import PrefillOptions
    from sift_cli.prefill.report import run_prefill
    from sift_cli.profile.additions import add_documents
    from sift_cli.profile.job import profile_corpus
    from sift_cli.shards.reader import ShardSet

    records = _nq_or_skip()
    item = nq_items(records, n_docs=11, n_items=1, seed=5)[0]
    passages = {p["id"]: p for p in nq_passages(records)}
    ids = list(item.doc_ids)
    missing = ids[5]
    write_jsonl([passages[d] for d in ids], tmp_path / "all.jsonl")
    write_jsonl([passages[d] for d in ids if d != missing], tmp_path / "ten.jsonl")
    profile_corpus(tmp_path / "ten.jsonl", tmp_path / "ten", smol, ProfileConfig(), num_shards=1)
    ten = ShardSet(tmp_path / "ten")
    text = {d.doc_id: d for d in load_documents(tmp_path / "all.jsonl")}[missing]
    add_documents(tmp_path / "one", [text], smol, profile_config_of(ten, smol), ten.prefix_token_ids)
    opts = PrefillOptions(backend="gather", repeat=1, max_new_tokens=4, warmup=0, noise_floor=False)  # agreement only
    profiled = run_prefill(smol, assemble([ten, ShardSet(tmp_path / "one")], smol, ids, item.question), opts)
    mixed_prompt = assemble(ten, smol, [text if d == missing else d for d in ids], item.question)
    assert [(d.doc_id, d.reason) for d in mixed_prompt.dense] == [(missing, NOT_PROFILED)]
    mixed = run_prefill(smol, mixed_prompt, opts)
    assert profiled["density"]["cells"] < mixed["density"]["cells"] < 1.0
    assert mixed["first_token_match"] or not profiled["first_token_match"]
    assert mixed["kl"] <= profiled["kl"] * 1.05 + 1e-6, (mixed["kl"], profiled["kl"])
    assert 0 < mixed["density"]["dense_docs_cells_share"] < 1
    print(f"profiled: cells {profiled['density']['cells']:.3f} KL {profiled['kl']:.2e}; one unprofiled: cells "
          f"{mixed['density']['cells']:.3f} KL {mixed['kl']:.2e}, its share {mixed['density']['dense_docs_cells_share']:.3f}")
