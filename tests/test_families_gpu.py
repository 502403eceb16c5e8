"""The model families on the GPU: flex with each attention feature (window, soft-capping, sinks) against the fp32
reference in bf16, over freshly poisoned memory with a per-row bound; every family's tiny model in bf16 with every
block listed equals its own eager forward; the cuda backend is refused for what its kernel does not compute."""

import pytest
import torch

from sift_cli.attention.backends import get_backend
from sift_cli.attention.cuda import CudaBackend
from sift_cli.attention.features import LayerFeatures
from sift_cli.attention.flex import FlexBackend
from sift_cli.attention.integration import prepare_plan, sparse_attention
from sift_cli.attention.reference import ReferenceBackend, block_sparse_attention
from sift_cli.block_table import BlockTable
from sift_cli.check_model import NOISE_MULTIPLE, ULPS, check_model, top_margin, ulp
from sift_cli.cuda.checks import ROW_BOUND, random_block_lists
from sift_cli.errors import SiftError
from sift_cli.model_features import features_of
from sift_cli.models import LoadedModel
from sift_cli.prefill.noise import parameters_in

from .families import FAMILIES, family_model

pytestmark = pytest.mark.gpu


def worst_row(a, b):
    return float(((a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1).clamp_min(1e-6)).max())


def poison_allocator(dev, n_bytes=1 << 28):
    """Leave NaNs in the caching allocator's free blocks, so an output that is not fully written shows."""
    torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=dev).fill_(float("nan"))


# one window and one soft-cap value throughout: each distinct pair is one more compilation (flex and the kernel)
FEATURES = {
    "window": dict(window=100),
    "softcap": dict(softcap=2.5),
    "sinks": dict(sinks=True),
    "all": dict(window=100, softcap=2.5, sinks=True),
}


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("L,D,H,H_kv", [(200, 64, 9, 3), (1531, 96, 4, 4), (700, 256, 2, 1)])
@pytest.mark.parametrize("density", [0.3])
def test_flex_features_equal_reference(feature, L, D, H, H_kv, density):
    torch.manual_seed(L + D + len(feature))
    dev = torch.device("cuda")
    q = torch.randn(H, L, D, device=dev, dtype=torch.bfloat16) * 2
    k = torch.randn(H_kv, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(H_kv, L, D, device=dev, dtype=torch.bfloat16)
    spec = dict(FEATURES[feature])
    if spec.pop("sinks", False):
        spec["sinks"] = torch.randn(H, device=dev) * 2
    feats = LayerFeatures(**spec)
    lists = random_block_lists(BlockTable.causal(L, 128, 64, device=dev), H, density, seed=L)
    ref = block_sparse_attention(q, k, v, lists, D ** -0.5, features=feats)
    poison_allocator(dev)
    out = FlexBackend().featured([lists])(0, q, k, v, D ** -0.5, feats)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    assert worst_row(out, ref) < ROW_BOUND, (feature, L, D)


@pytest.mark.parametrize("name", FAMILIES)
def test_family_every_block_flex_bf16_equals_model(name):
    dev = torch.device("cuda")
    model = family_model(name, seed=3, dtype=torch.bfloat16).to(dev)
    lm = LoadedModel(model, None, name, name, "test", "test", dev, torch.bfloat16)
    poison_allocator(dev)
    r = check_model(lm, "auto", length=301)
    assert r["backend"] == "flex"  # head_dim 16-32, or an attention feature: never the cuda kernel
    assert r["ok"] and r["half_precision_noise"] is not None, r


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gemma3_text", "gpt_oss", "qwen2"])
def test_family_sparse_flex_equals_reference(name):
    """Sparse lists (not every block): flex in bf16 equals the reference backend (fp32 math) on the model."""
    dev = torch.device("cuda")
    model = family_model(name, seed=4, dtype=torch.bfloat16).to(dev)
    feats = features_of(model)
    L = 517
    table = BlockTable.causal(L, 128, 64, device=dev)
    lists = [random_block_lists(table, feats.n_heads, 0.4, seed=i) for i in range(feats.n_layers)]
    ids = torch.randint(3, 97, (1, L), generator=torch.Generator().manual_seed(1)).to(dev)
    logits = {}
    with torch.inference_mode():
        for backend in (ReferenceBackend(), FlexBackend()):
            poison_allocator(dev)
            with sparse_attention(model, prepare_plan(backend, table, lists)):
                logits[backend.name] = model(input_ids=ids, use_cache=False).logits.float()
        with parameters_in(model, torch.float32), sparse_attention(model, prepare_plan(ReferenceBackend(), table,
                                                                                         lists)):
            reference32 = model(input_ids=ids, use_cache=False).logits.float()
    ref = logits["reference"]
    assert torch.isfinite(logits["flex"]).all()
    # the bound check_model uses: twice what bf16 rounding itself changes (the same lists with fp32 parameters),
    # never below two units in the last place of the largest logit
    noise = float((ref - reference32).abs().max())
    bound = max(NOISE_MULTIPLE * noise, ULPS * ulp(float(ref.abs().max()), torch.bfloat16))
    assert (logits["flex"] - ref).abs().max() <= bound, (name, noise)
    if top_margin(ref[0, -1]) > bound:
        assert torch.equal(logits["flex"][0, -1].argmax(), ref[0, -1].argmax())


@pytest.mark.hopper
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("L,D,H,H_kv,block_m", [(200, 64, 9, 3, 128), (1000, 128, 8, 1, 64), (4113, 128, 8, 2, 128)])
@pytest.mark.parametrize("density", [1.0, 0.3])
def test_cuda_features_equal_reference(feature, L, D, H, H_kv, block_m, density):
    """The kernel's window and soft-cap variants and its sinks through the LSE, split rows included (long L)."""
    usable, why = CudaBackend.available()
    if not usable:
        pytest.skip(why)
    torch.manual_seed(L + D + len(feature))
    dev = torch.device("cuda")
    q = torch.randn(L, H, D, device=dev, dtype=torch.bfloat16).transpose(0, 1) * 2  # the model's layout
    k, v = (torch.randn(L, H_kv, D, device=dev, dtype=torch.bfloat16).transpose(0, 1) for _ in range(2))
    spec = dict(FEATURES[feature])
    if spec.pop("sinks", False):
        spec["sinks"] = torch.randn(H, device=dev) * 2
    feats = LayerFeatures(**spec)
    table = BlockTable.causal(L, block_m, 64, device=dev)
    lists = random_block_lists(table, H, density, seed=L)
    ref = block_sparse_attention(q, k, v, lists, D ** -0.5, features=feats)
    attend = CudaBackend().prepare(table, [lists])
    poison_allocator(dev)
    out = attend.featured(0, q, k, v, D ** -0.5, feats)
    assert torch.isfinite(out.float()).all()
    assert worst_row(out, ref) < ROW_BOUND, (feature, L, D, block_m)
    plain = attend(0, q, k, v, D ** -0.5)  # the plain kernel of the same plan is unaffected
    assert worst_row(plain, block_sparse_attention(q, k, v, lists, D ** -0.5)) < ROW_BOUND


@pytest.mark.hopper
@pytest.mark.parametrize("name", ["mistral", "gemma2", "gemma3_text", "gpt_oss", "qwen2", "llama"])
def test_family_every_block_cuda_bf16_equals_model(name):
    usable, why = CudaBackend.available()
    if not usable:
        pytest.skip(why)
    dev = torch.device("cuda")
    model = family_model(name, seed=3, dtype=torch.bfloat16, head_dim=64).to(dev)
    lm = LoadedModel(model, None, name, name, "test", "test", dev, torch.bfloat16)
    poison_allocator(dev)
    r = check_model(lm, "cuda", length=301)
    assert r["backend"] == "cuda" and r["ok"] and r["half_precision_noise"] is not None, r


@pytest.mark.hopper
def test_cuda_backend_refuses_features():
    dev = torch.device("cuda")
    feats = features_of(family_model("gpt_oss", dtype=torch.bfloat16))
    with pytest.raises(SiftError, match="--backend cuda: model type gpt_oss has head_dim 16"):
        get_backend("cuda", dev, feats)
    assert get_backend("auto", dev, feats).name == "flex"
