"""Every supported model family computed as the model defines it (CPU, fp32, tiny random configs whose windows
are smaller than a document): profiling bits equal a brute force over the model's own eager probabilities, sparse
prefill with every block listed equals the model's own forward, and every unsupported attention is refused."""

import json
from dataclasses import replace

import pytest
import torch

from sift_cli.attention.backends import _cuda_refusal, get_backend
from sift_cli.attention.features import window_blocks
from sift_cli.attention.integration import causal_attention
from sift_cli.attention.swap import swapped_attention
from sift_cli.check_model import check_model, ulp
from sift_cli.config import ProfileConfig
from sift_cli.errors import SiftError
from sift_cli.model_features import features_of, refuse_config
from sift_cli.models import LoadedModel
from sift_cli.profile.forward import profile_batch, resolve_stats

from .families import FAMILIES, WINDOW, family_model
from .helpers import brute_force_bits, command_line, eager_attentions

PREFIX = [1, 17, 29, 5, 88]
FEATURED = ("mistral", "gemma2", "gpt_oss")  # one of each extra: window, soft-cap, sinks


@pytest.fixture(scope="module")
def models():
    return {}


def model_of(models, name):
    if name not in models:
        models[name] = family_model(name, seed=len(name))
    return models[name]


def loaded(model, name):
    return LoadedModel(model, None, name, name, "test", "test", torch.device("cpu"), torch.float32)


def random_ids(n, seed, vocab=97):
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", FAMILIES)
def test_inventory(models, name):
    f = features_of(model_of(models, name))
    windowed = {"llama": 0, "olmo2": 0, "mistral": 2, "phi3": 2}.get(name, 1)
    assert sum(w == WINDOW for w in f.windows) == windowed and f.n_layers == 2
    assert (f.softcap is not None) == (name == "gemma2") and f.sinks == (name == "gpt_oss")
    assert f.scaling == model_of(models, name).model.layers[0].self_attn.scaling


@pytest.mark.parametrize("backend", ["reference", "gather"])
@pytest.mark.parametrize("name", FAMILIES)
def test_every_block_prefill_equals_model_forward(models, name, backend):
    r = check_model(loaded(model_of(models, name), name), backend, length=3 * WINDOW + 5)
    assert r["ok"] and r["max_abs_dlogit"] <= 1e-4 and r["first_token_equal"], r


@pytest.mark.parametrize("name", FEATURED)
def test_half_precision_check_bounds_by_the_models_own_rounding(name):
    """In bf16 the tolerance is derived: twice what bf16 itself changes in the model's forward (fp32 parameters
    against bf16), at least two units in the last place of the largest logit; the parameters come back unchanged."""
    model = family_model(name, seed=7, dtype=torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lm = LoadedModel(model, None, name, name, "test", "test", torch.device("cpu"), torch.bfloat16)
    r = check_model(lm, "reference", length=3 * WINDOW + 5)
    assert r["half_precision_noise"] > 0 and r["tolerance"] >= 2 * r["half_precision_noise"] - 1e-9, r
    assert r["ok"], r
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


def test_ulp():
    assert ulp(1.0, torch.bfloat16) == 2 ** -7 and ulp(78.5, torch.bfloat16) == 0.5
    assert ulp(3.0, torch.float16) == 2 ** -9 and ulp(5.0, torch.float32) == 0.0


@pytest.mark.parametrize("name", FAMILIES)
def test_profiling_bits_equal_eager_brute_force(models, name):
    model = model_of(models, name)
    windows = features_of(model).windows
    cfg = ProfileConfig(tile=16, alpha=0.004, beta=0.03, gamma=0.08)
    for n in (3 * WINDOW + 1, 17):  # window smaller than the document; a document inside one window
        doc = random_ids(n, n)
        got = profile_batch(model, PREFIX, [doc], cfg)[0]
        for layer, A in enumerate(eager_attentions(model, PREFIX + doc)):
            la, ca = brute_force_bits(A, len(PREFIX), n, cfg.tile, cfg.alpha, cfg.beta, cfg.gamma, windows[layer])
            assert (got.la_tiles[layer].numpy() == la).all(), f"{name} LA layer {layer} n {n}"
            assert (got.ca_pages[layer].numpy() == ca).all(), f"{name} CA layer {layer} n {n}"


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_window_leaves_unreachable_tiles_unset(models, name):
    model = model_of(models, name)
    n, T = 101, 8
    got = profile_batch(model, PREFIX, [random_ids(n, 3)], ProfileConfig(tile=T, alpha=0, beta=0, gamma=0))[0]
    P = -(-n // T)
    starts = torch.arange(P) * T
    reachable = window_blocks(starts, torch.clamp(n - starts, max=T), starts, torch.clamp(n - starts, max=T),
                              WINDOW) & torch.ones(P, P, dtype=torch.bool).tril()
    for layer, w in enumerate(features_of(model).windows):
        expected = reachable if w is not None else torch.ones(P, P, dtype=torch.bool).tril()
        assert torch.equal(got.la_tiles[layer], expected[None].expand_as(got.la_tiles[layer]))
        assert not (got.la_tiles[layer] & ~expected).any()


@pytest.mark.parametrize("name", FEATURED)
def test_dense_and_cached_decode_follow_the_model(models, name):
    """The swapped attention outside a sparse plan (dense prefill, generation steps) computes the features too."""
    model = model_of(models, name)
    ids = torch.tensor([random_ids(61, 5)])
    with torch.no_grad(), swapped_attention(model, "eager"):
        want = model(ids, use_cache=False).logits
    with torch.no_grad(), causal_attention(model):
        dense = model(ids, use_cache=False).logits
        past = model(ids[:, :-3], use_cache=True).past_key_values
        steps = [model(ids[:, i:i + 1], past_key_values=past, use_cache=True).logits for i in range(58, 61)]
    assert (dense - want).abs().max() <= 1e-4
    assert (torch.cat(steps, 1) - want[:, -3:]).abs().max() <= 1e-4


def test_featured_models_avoid_the_cuda_kernel(models):
    plain, sinks = features_of(model_of(models, "olmo2")), features_of(model_of(models, "gpt_oss"))
    assert _cuda_refusal(plain) == "head_dim 16 (the kernel has 64 and 128)"
    assert _cuda_refusal(replace(sinks, head_dim=64)) is None  # the kernel's variants and its LSE compute them
    assert _cuda_refusal(replace(plain, head_dim=128)) is None
    assert get_backend("auto", torch.device("cpu"), sinks).name == "gather"
    assert resolve_stats("auto", torch.device("cpu"), sinks.names()) == "torch"
    with pytest.raises(SiftError, match="--stats triton computes plain causal attention"):
        resolve_stats("triton", torch.device("cpu"), sinks.names())


def _refused_configs():
    import transformers as tf

    return [
        ("t5", "encoder-decoder", lambda: tf.T5Config()),
        ("deepseek_v3", "latent attention", lambda: tf.DeepseekV3Config()),
        ("qwen3_next", "layer type linear_attention", lambda: tf.Qwen3NextConfig()),
        ("gemma3_text", "bidirectional", lambda: tf.Gemma3TextConfig(use_bidirectional_attention=True)),
        ("gemma3", "multimodal wrapper", lambda: tf.Gemma3Config()),
        ("gpt2", "not inventoried", lambda: tf.GPT2Config()),
    ]


@pytest.mark.parametrize("model_type,feature,make", _refused_configs(), ids=lambda x: x if isinstance(x, str) else "")
def test_unsupported_attention_is_refused(model_type, feature, make):
    with pytest.raises(SiftError, match=f"model type {model_type}: .*{feature}"):
        refuse_config(make())


def test_unknown_attention_module_is_refused(models):
    model = family_model("llama")
    model.model.layers[1].self_attn = family_model("mistral").model.layers[1].self_attn
    with pytest.raises(SiftError, match="model type llama: attention module MistralAttention"):
        features_of(model)


def test_check_model_command(tiny_ckpt, tmp_path, capsys):
    from sift_cli.cli import main

    with command_line("check-model", tiny_ckpt, "--device", "cpu", "--tokens", "70", "--json"):
        main()  # returns: exit 0
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] and r["backend"] == "gather" and r["features"]["model_type"] == "llama"

    import transformers as tf

    tf.DeepseekV3Config().save_pretrained(tmp_path / "mla")
    with command_line("check-model", tmp_path / "mla", "--device", "cpu"), pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert "model type deepseek_v3: multi-head latent attention (MLA) is not supported" in err[0]


def test_a_window_the_prompt_fits_in_is_plain(models):
    model = model_of(models, "mistral")
    feats = features_of(model)
    assert feats.for_length(WINDOW).plain and not feats.for_length(WINDOW + 1).plain
    r = check_model(loaded(model, "mistral"), "gather", length=WINDOW)  # the plain gather path, still exact
    assert r["ok"], r


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_profile_and_prefill_a_featured_checkpoint(tmp_path, tiny_ckpt, small_corpus, name):
    """The whole path on a checkpoint with attention features: load (inventory), profile, assemble, prefill. With
    real bits gather equals the reference backend; with every bit set SIFT equals full recompute."""
    from sift_cli.attention.reference import ReferenceBackend
    from sift_cli.models import load_model
    from sift_cli.prefill.assemble import assemble
    from sift_cli.prefill.options import PrefillOptions
    from sift_cli.prefill.report import run_prefill
    from sift_cli.prefill.run import dense_prefill, sparse_prefill
    from sift_cli.profile.job import profile_corpus
    from sift_cli.shards.reader import ShardSet

    from .families import family_checkpoint

    lm = load_model(str(family_checkpoint(tmp_path / name, name, tiny_ckpt)), device="cpu")
    assert not features_of(lm.model).plain
    docs = ["doc09", "doc03", "doc11", "doc07"]
    corpus = tmp_path / "four"
    corpus.mkdir()
    for d in docs:
        (corpus / f"{d}.txt").write_text((small_corpus / f"{d}.txt").read_text())
    for cfg, sub in ((ProfileConfig(tile=16, alpha=0.02, beta=0.05, gamma=0.2), "real"),
                     (ProfileConfig(tile=16, alpha=0.0, beta=0.0, gamma=0.0), "all")):
        profile_corpus(corpus, tmp_path / sub, lm, cfg, num_shards=1)
        prompt = assemble(ShardSet(tmp_path / sub), lm, docs, "Which fox jumps?")
        assert len(prompt.input_ids) > 2 * WINDOW
        x = torch.tensor([prompt.input_ids])
        ref = sparse_prefill(lm, prompt, ReferenceBackend(), x, PrefillOptions()).logits
        gather = sparse_prefill(lm, prompt, get_backend("gather", lm.device), x, PrefillOptions()).logits
        assert (gather - ref).abs().max() <= 1e-4, sub
    assert (ref - dense_prefill(lm, x).logits).abs().max() <= 1e-4  # every bit set
    r = run_prefill(lm, prompt, PrefillOptions(backend="auto", repeat=1, warmup=0, max_new_tokens=3))
    assert r["first_token_match"] and r["same_answer"]


@pytest.mark.parametrize("window", [1, 7, 64, 100, 1000])
def test_window_lists_drop_only_hidden_blocks(window):
    from sift_cli.attention.features import LayerFeatures, window_lists
    from sift_cli.attention.reference import block_sparse_attention
    from sift_cli.block_table import BlockTable
    from sift_cli.cuda.checks import random_block_lists

    table = BlockTable.causal(777, 64, 64)
    lists = random_block_lists(table, 3, 0.5, seed=window)
    kept = window_lists(lists, window)
    assert kept.computed_blocks() <= lists.computed_blocks()
    if window >= 777:
        assert torch.equal(kept.indices, lists.indices[: kept.indices.numel()])
    q, k, v = torch.randn(3, 777, 16), torch.randn(1, 777, 16), torch.randn(1, 777, 16)
    feats = LayerFeatures(window=window, softcap=3.0, sinks=torch.randn(3))
    a = block_sparse_attention(q, k, v, lists, 0.25, features=feats)
    b = block_sparse_attention(q, k, v, kept, 0.25, features=feats)
    assert torch.equal(a, b)
    if window <= 64:  # a block wholly before row - window is gone
        assert kept.computed_blocks() < lists.computed_blocks()
