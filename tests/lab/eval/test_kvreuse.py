"""KV reuse and CacheBlend: RoPE re-rotation, and the limits where they equal the dense forward."""

import pytest
import torch

from sift_cli.lab.eval.kvreuse import (blend_forward, cacheblend_prefill, inv_freq_of, kv_reuse_prefill, reused_kv,
                                       rotate, standalone_kv)
from sift_cli.models import load_model

from ...helpers import tiny_checkpoint


@pytest.fixture(scope="module")
def deep_lm(tmp_path_factory):
    """Four layers: CacheBlend's check layer is 1, so layers 2-3 exercise partial recompute."""
    path = tiny_checkpoint(tmp_path_factory.mktemp("deep"), seed=3, layers=4, max_pos=1024)
    return load_model(str(path), device="cpu")

@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64}])
def test_rotation_moves_keys_to_new_positions(rope):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    kw = {"rope_parameters": rope} if rope else {}
    cfg = LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=50, max_position_embeddings=4096, **kw)
    model = LlamaForCausalLM(cfg)
    k = torch.randn(1, 2, 10, 16, dtype=torch.float64)
    pos = torch.arange(5, 15)[None]
    cos, sin = model.model.rotary_emb(k.float(), pos)
    _, at_p = apply_rotary_pos_emb(k, k, cos.double(), sin.double())
    cos2, sin2 = model.model.rotary_emb(k.float(), pos + 777)
    _, at_p2 = apply_rotary_pos_emb(k, k, cos2.double(), sin2.double())
    moved = rotate(at_p[0].float(), torch.full((10,), 777.0), inv_freq_of(model))
    assert torch.allclose(moved.double(), at_p2[0], atol=2e-4)

def _prompt(lm, docs, suffix="What is it?"):
    from sift_cli.tokens import prefix_token_ids, suffix_token_ids

    prefix = prefix_token_ids(lm.tokenizer)
    toks = [lm.tokenizer(d, add_special_tokens=False)["input_ids"] for d in docs]
    suf = suffix_token_ids(lm.tokenizer, suffix)
    ids = list(prefix) + [t for d in toks for t in d] + suf
    starts, pos = [], len(prefix)
    for t in toks:
        starts.append(pos)
        pos += len(t)
    return prefix, toks, suf, ids, starts


def _reused(lm, docs):
    """The prompt of `docs` and each document's standalone KV re-positioned for it: (suffix, ids, keys, values)."""
    prefix, toks, suf, ids, starts = _prompt(lm, docs)
    pkv, dkv = standalone_kv(lm.model, prefix, toks)
    keys, values = reused_kv(pkv, dkv, starts, len(prefix), inv_freq_of(lm.model))
    return suf, ids, keys, values

def test_kv_reuse_of_a_single_document_is_the_dense_forward(deep_lm):
    lm = deep_lm
    suf, ids, keys, values = _reused(lm, ["The quick brown fox jumps over the lazy dog. " * 3])
    logits, _, _ = kv_reuse_prefill(lm, keys, values, suf)
    with torch.inference_mode():
        dense = lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    assert torch.allclose(logits, dense, atol=1e-4)

def test_cacheblend_with_full_recompute_is_the_dense_forward(deep_lm):
    lm = deep_lm
    suf, ids, keys, values = _reused(lm, ["Sphinx of black quartz, judge my vow. " * 2,
                                          "Pack my box with five dozen liquor jugs. " * 3])
    with torch.inference_mode():
        dense = lm.model(input_ids=torch.tensor([ids]), use_cache=True)
    d_logits = dense.logits[0, -1].float()
    logits, cache, _, share = cacheblend_prefill(lm, ids, keys, values, len(suf), ratio=1.0)
    assert share == 1.0 and torch.allclose(logits, d_logits, atol=1e-4)
    for li in range(lm.n_layers):  # the blended cache is the dense cache
        assert torch.allclose(cache.layers[li].keys, dense.past_key_values.layers[li].keys, atol=1e-4)

def test_cacheblend_recomputes_the_chosen_share(deep_lm):
    lm = deep_lm
    suf, ids, keys, values = _reused(lm, ["Sphinx of black quartz, judge my vow. " * 4,
                                          "How vexingly quick daft zebras jump! " * 4])
    n_ctx = len(ids) - len(suf)
    for mask in ("causal", "bottom-right"):
        res = blend_forward(lm.model, torch.tensor(ids), lambda li: (keys[li], values[li]), len(suf), 0.15, 1, mask)
        assert res.selected.numel() == int(n_ctx * 0.15) + len(suf)
        assert res.selected[-len(suf):].tolist() == list(range(n_ctx, len(ids)))
        assert torch.isfinite(res.logits).all()
        # positions not recomputed keep the reused KV after the check layer
        keep = torch.ones(len(ids), dtype=torch.bool)
        keep[res.selected] = False
        assert torch.equal(res.values[2][:, keep], values[2][:, keep[:n_ctx]])
    # no recompute at all (ratio → 0) still answers: only the suffix is fresh
    tiny = blend_forward(lm.model, torch.tensor(ids), lambda li: (keys[li], values[li]), len(suf), 0.0)
    assert tiny.selected.numel() == len(suf)
