"""The Triton statistics path (sift_cli/profile/triton_statistics.py) against the reference path and the brute force.

On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1); `test_kernels_compile_for_hopper` also
compiles them for sm_90 without a GPU (Triton ships ptxas), so a kernel that only the compiler rejects is caught
here. Skipped entirely where triton is not installed (it is an optional dependency).
"""

import os
import sys

import pytest
import torch

GPU = torch.cuda.is_available()
if not GPU and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton.language is first imported, so set before it
triton = pytest.importorskip("triton")
import triton.language.standard  # noqa: E402

INTERPRETED = type(triton.language.standard.zeros).__name__ == "InterpretedFunction"
if not GPU and not INTERPRETED:
    pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set; run this file alone",
                allow_module_level=True)
DEVICE = "cuda" if GPU else "cpu"

from sift_cli.config import ProfileConfig  # noqa: E402
from sift_cli.errors import SiftError  # noqa: E402
from sift_cli.profile import triton_statistics as st  # noqa: E402
from sift_cli.profile.forward import profile_batch, resolve_stats  # noqa: E402
from sift_cli.profile.statistics import doc_attention_bits  # noqa: E402

from ..helpers import brute_force_bits, eager_attentions, tiny_llama  # noqa: E402

PREFIX = [1, 17, 29, 5, 88]


@pytest.fixture
def interpret():
    """On CPU the kernels run interpreted (set at import above); on a GPU machine they run compiled."""
    if not GPU:
        assert st.interpreting()


def random_qk(B, H, H_kv, S, D, seed, spread=2.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, S, D, generator=g) * spread).to(dtype)
    k = (torch.randn(B, H_kv, S, D, generator=g) * spread).to(dtype)
    return q.to(DEVICE), k.to(DEVICE)


def assert_batch_equals_reference(q, k, prefix, lengths, scale, cfg):
    la, ca = st.batch_attention_bits(q, k, prefix, lengths, scale, cfg)
    for b, n in enumerate(lengths):
        ref_la, ref_ca = doc_attention_bits(q[b], k[b], prefix, n, scale, cfg)
        P = ref_ca.shape[-1]
        assert torch.equal(la[b, :, :P, :P], ref_la), f"LA differs for doc {b} (n={n})"
        assert torch.equal(ca[b, :, :P], ref_ca), f"CA differs for doc {b} (n={n})"
        assert not ca[b, :, P:].any()


@pytest.mark.parametrize("tile,lengths", [(16, [1, 15, 16, 17, 70]), (64, [63, 64, 65, 130]),
                                          (128, [129, 20]), (32, [100, 33])])
def test_batch_bits_equal_reference_at_awkward_lengths(interpret, tile, lengths):
    q, k = random_qk(len(lengths), 4, 2, 5 + max(lengths), 16, seed=tile)
    assert_batch_equals_reference(q, k, 5, lengths, 0.25, ProfileConfig(tile=tile))


def test_head_dim_64_no_gqa_and_other_thresholds(interpret):
    q, k = random_qk(2, 3, 3, 3 + 150, 64, seed=7, spread=1.0)
    assert_batch_equals_reference(q, k, 3, [150, 77], 0.125, ProfileConfig(tile=64, alpha=0.002, beta=0.02,
                                                                           gamma=0.05))


def test_bf16_inputs(interpret):
    q, k = random_qk(2, 4, 2, 7 + 150, 64, seed=1, spread=1.0, dtype=torch.bfloat16)
    assert_batch_equals_reference(q, k, 7, [150, 70], 0.125, ProfileConfig(tile=64))


def test_zero_thresholds_select_every_causal_tile(interpret):
    q, k = random_qk(1, 2, 1, 4 + 90, 16, seed=3)
    cfg = ProfileConfig(tile=16, alpha=0, beta=0, gamma=0)
    la, ca = st.batch_attention_bits(q, k, 4, [90], 0.25, cfg)
    assert ca.all() and torch.equal(la[0, 0].cpu(), torch.ones(6, 6, dtype=torch.bool).tril())
    assert_batch_equals_reference(q, k, 4, [90], 0.25, cfg)


def test_exact_ties_decide_like_the_reference(interpret):
    """All scores equal (q = 0): row i's probabilities are exactly 1/(keys it sees). With α = 1/64 and β = 1/32
    some rows sit exactly on the thresholds; the log-domain test keeps `p >= threshold` for them, as the
    reference's softmax does."""
    q = torch.zeros(1, 2, 7 + 150, 16, device=DEVICE)
    k = torch.randn(1, 2, 7 + 150, 16, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    cfg = ProfileConfig(tile=16, alpha=1 / 64, beta=1 / 32, gamma=0.10)
    la, ca = st.batch_attention_bits(q, k, 7, [150], 0.125, cfg)
    ref_la, ref_ca = doc_attention_bits(q[0], k[0], 7, 150, 0.125, cfg)
    assert torch.equal(la[0], ref_la) and torch.equal(ca[0], ref_ca)
    # the rows that see exactly 64 keys (doc row 56) put p == α on tiles (3, 0..3): kept
    assert ref_la[:, 3, :4].all()


def test_threshold_kernel_matches_torch_fallback(interpret):
    q, k = random_qk(2, 4, 2, 6 + 140, 32, seed=11)
    lengths = [140, 61]
    ta, tb = st.row_thresholds(q, k, 6, torch.tensor(lengths, dtype=torch.int32), 140, 0.25, 1e-3, 1e-2)
    ra, rb = st.torch_row_thresholds(q, k, 6, lengths, 0.25, 1e-3, 1e-2)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(ta[b, :, :n], ra[b, :, :n], rtol=0, atol=1e-4)
        torch.testing.assert_close(tb[b, :, :n], rb[b, :, :n], rtol=0, atol=1e-4)
    # the stats kernel with the torch thresholds gives the reference bits too
    cfg = ProfileConfig(tile=32)
    la, ca = st.batch_attention_bits(q, k, 6, lengths, 0.25, cfg, thresholds=(ra, rb))
    for b, n in enumerate(lengths):
        ref_la, ref_ca = doc_attention_bits(q[b], k[b], 6, n, 0.25, cfg)
        P = ref_ca.shape[-1]
        assert torch.equal(la[b, :, :P, :P], ref_la) and torch.equal(ca[b, :, :P], ref_ca)


@pytest.mark.parametrize("tile", [16, 64])
def test_profile_batch_triton_equals_brute_force(interpret, tile):
    if GPU:
        pytest.skip("CPU brute force (the GPU comparison is test_gpu_triton_equals_torch_path)")
    model = tiny_llama(seed=tile)
    g = torch.Generator().manual_seed(tile)
    docs = [torch.randint(3, 211, (n,), generator=g).tolist() for n in (tile + 1, 5, tile - 1)]
    cfg = ProfileConfig(tile=tile, stats="triton")
    got = profile_batch(model, PREFIX, docs, cfg)
    ref = profile_batch(model, PREFIX, docs, ProfileConfig(tile=tile, stats="torch"))
    for doc, fast, slow in zip(docs, got, ref):
        assert fast.pack() == slow.pack()
        for layer, A in enumerate(eager_attentions(model, PREFIX + doc)):
            la, ca = brute_force_bits(A, len(PREFIX), len(doc), tile, cfg.alpha, cfg.beta, cfg.gamma)
            assert (fast.la_tiles[layer].numpy() == la).all(), f"LA layer {layer}"
            assert (fast.ca_pages[layer].numpy() == ca).all(), f"CA layer {layer}"


@pytest.mark.slow
def test_profile_corpus_same_shards_with_either_statistics_path(interpret, tmp_path, tiny_lm):
    """Same bits, same shards: the whole job with --stats triton writes byte-identical shard files."""
    import filecmp

    from sift_cli.profile.job import profile_corpus
    from sift_cli.shards.files import list_parts

    from ..helpers import TRAINING_TEXT

    if GPU:
        pytest.skip("CPU model")
    small_corpus = tmp_path / "corpus"
    small_corpus.mkdir()
    for i in range(5):
        (small_corpus / f"d{i}.txt").write_text(" ".join(TRAINING_TEXT[i: i + 1 + i % 3]))
    a, b = tmp_path / "torch", tmp_path / "triton"
    profile_corpus(small_corpus, a, tiny_lm, ProfileConfig(tile=16, batch_tokens=2048, stats="torch"), num_shards=3)
    profile_corpus(small_corpus, b, tiny_lm, ProfileConfig(tile=16, batch_tokens=2048, stats="triton"),
                   num_shards=3)
    names = sorted(p.name for p in list_parts(a))
    assert names == sorted(p.name for p in list_parts(b)) and len(names) == 3
    for n in names:
        assert filecmp.cmp(a / n, b / n, shallow=False), n


def test_stats_option_resolution(monkeypatch):
    if GPU:
        pytest.skip("CPU behaviour")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    assert resolve_stats("auto", cpu) == "torch" and resolve_stats("torch", cpu) == "torch"
    with pytest.raises(SiftError, match="--stats triton needs"):
        resolve_stats("triton", cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_stats("triton", cpu) == "triton" and resolve_stats("auto", cpu) == "torch"
    with pytest.raises(SiftError, match="--stats"):
        ProfileConfig(stats="fast").check()


COMPILE_SCRIPT = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sift_cli.profile import triton_statistics as st

k1, k2 = triton.jit(st._thresholds_kernel), triton.jit(st._stats_kernel)
ptr = {"Q": "*bf16", "K": "*bf16", "TA": "*fp32", "TB": "*fp32", "LENS": "*i32", "LA": "*i8", "CNT": "*i32",
       "scale": "fp32", "ln_alpha": "fp32", "ln_beta": "fp32"}

def compile_(fn, constants):
    sig = {n: "constexpr" if n in constants else ptr.get(n, "i32") for n in fn.arg_names}
    return triton.compile(ASTSource(fn, sig, constants), target=GPUTarget("cuda", 90, 32))

for D in (64, 128):
    c1 = compile_(k1, dict(KEYS_MAX=0, DYNAMIC_LOOPS=True, BLOCK_M=64, BLOCK_N=64, BLOCK_D=D, PRECISION="tf32"))
    c2 = compile_(k2, dict(ROWS_MAX=0, DYNAMIC_LOOPS=True, T=64, TSUB=64, BLOCK_B=64, BLOCK_D=D, PRECISION="tf32"))
    assert "wgmma" in c1.asm["ptx"] and "wgmma" in c2.asm["ptx"], "no tensor-core wgmma in the PTX"
compile_(k2, dict(ROWS_MAX=0, DYNAMIC_LOOPS=True, T=16, TSUB=16, BLOCK_B=64, BLOCK_D=64, PRECISION="tf32"))
print("compiled")
"""


@pytest.mark.slow
def test_kernels_compile_for_hopper(tmp_path):
    """Both kernels compile for sm_90 with bf16 inputs (tensor-core wgmma in the PTX) at head dims 64 and 128,
    and with LA tiles folded inside a block (T=16): no GPU needed, Triton ships ptxas. A fresh process, since
    this one may run Triton interpreted."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode and "ptxas" in r.stderr and "not found" in r.stderr.lower():
        pytest.skip("no ptxas in this triton install")
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]


@pytest.mark.gpu
def test_gpu_triton_equals_torch_path():
    torch.manual_seed(0)
    q, k = random_qk(3, 8, 2, 20 + 1000, 64, seed=5, spread=1.0, dtype=torch.bfloat16)
    q, k = q.cuda(), k.cuda()
    lengths = [1000, 517, 64]
    cfg = ProfileConfig(tile=64)
    la, ca = st.batch_attention_bits(q, k, 20, lengths, 0.125, cfg)
    for b, n in enumerate(lengths):
        ref_la, ref_ca = doc_attention_bits(q[b], k[b], 20, n, 0.125, cfg)
        P = ref_ca.shape[-1]
        assert torch.equal(la[b, :, :P, :P], ref_la) and torch.equal(ca[b, :, :P], ref_ca)
