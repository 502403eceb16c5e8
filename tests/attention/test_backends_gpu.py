"""The GPU backends against the reference: FlexAttention on random and decoded lists; flex and cuda on lists decoded
from real profiles; the whole bundled model with the cuda backend against the reference backend; every bit set
equals dense; CUDA-graph replays equal eager SIFT, across two prompts of different lengths."""

import numpy as np
import pytest
import torch

from sift_cli.attention.backends import get_backend
from sift_cli.attention.cuda import CudaBackend
from sift_cli.attention.flex import FlexBackend
from sift_cli.attention.integration import sparse_attention
from sift_cli.attention.reference import ReferenceBackend, block_sparse_attention
from sift_cli.block_lists import decode_layer, dense_block_lists
from sift_cli.block_table import BlockTable
from sift_cli.config import ProfileConfig
from sift_cli.cuda.checks import ROW_BOUND, random_block_lists
from sift_cli.lab.datasets import write_jsonl
from sift_cli.models import load_model
from sift_cli.prefill.assemble import assemble
from sift_cli.prefill.options import PrefillOptions, for_prompt
from sift_cli.prefill.plan import prepare_sparse, prompt_tensors
from sift_cli.prefill.report import run_prefill
from sift_cli.prefill.run import dense_prefill, run_forward, sparse_prefill
from sift_cli.profile.job import profile_corpus
from sift_cli.sample import sample_documents
from sift_cli.shards.reader import ShardSet
from sift_cli.store.bitstore import BitStore

from ..test_block_lists import AWKWARD, random_prompt

pytestmark = pytest.mark.gpu


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def worst_row(a, b):
    return float(((a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1).clamp_min(1e-6)).max())


def need_cuda_backend():
    usable, why = CudaBackend.available()
    if not usable:
        pytest.skip(why)


@pytest.mark.parametrize("L,D,H,H_kv", [(1, 64, 9, 3), (129, 128, 4, 4), (1000, 64, 9, 3), (4113, 128, 8, 2)])
@pytest.mark.parametrize("density", [1.0, 0.3])
def test_flex_equals_reference(L, D, H, H_kv, density):
    torch.manual_seed(L + D)
    dev = torch.device("cuda")
    q = torch.randn(H, L, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(H_kv, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(H_kv, L, D, device=dev, dtype=torch.bfloat16)
    lists = random_block_lists(BlockTable.causal(L, 128, 64, device=dev), H, density, seed=L)
    ref, ref_lse = block_sparse_attention(q, k, v, lists, D ** -0.5, return_lse=True)
    out, lse = FlexBackend().forward(q, k, v, lists, D ** -0.5, return_lse=True)
    assert torch.isfinite(out.float()).all()
    assert worst_row(out, ref) < 2e-2
    assert float((lse - ref_lse).abs().max()) < 2e-2


@pytest.mark.parametrize("prefix,docs,suffix", AWKWARD)
@pytest.mark.parametrize("backend", ["flex", "cuda"])
def test_backends_on_document_tables(prefix, docs, suffix, backend):
    """Lists decoded over document-aligned tables of awkward segments; poisoned outputs; a per-row bound."""
    if backend == "cuda":
        need_cuda_backend()
    rng = np.random.default_rng(prefix + len(docs))
    pb, _ = random_prompt(rng, 64, n_layers=1, n_heads=9, doc_lengths=docs, prefix_len=prefix, suffix_len=suffix)
    dev = torch.device("cuda")
    lists = decode_layer(pb.to(dev), 0, BlockTable.for_layout(pb.layout, 128, 64))
    assert torch.equal(lists.indices.cpu(), decode_layer(pb, 0, BlockTable.for_layout(pb.layout)).indices)
    L = pb.layout.seq_len
    q = torch.randn(L, 9, 64, device=dev, dtype=torch.bfloat16).transpose(0, 1)
    k, v = (torch.randn(L, 3, 64, device=dev, dtype=torch.bfloat16).transpose(0, 1) for _ in range(2))
    ref = block_sparse_attention(q, k, v, lists, 0.125)
    attend = get_backend(backend, dev).prepare(lists.table, [lists])
    out = attend(0, q, k, v, 0.125)
    assert torch.isfinite(out.float()).all() and worst_row(out, ref) < 2e-2


@pytest.mark.parametrize("backend", ["flex", "cuda"])
def test_backends_on_lists_from_real_profiles(tmp_path, tiny_lm, small_corpus, backend):
    """Lists decoded from bits that `sift profile` wrote (a real model's attention), not random ones."""
    if backend == "cuda":
        need_cuda_backend()
    profile_corpus(small_corpus, tmp_path / "s", tiny_lm, ProfileConfig(tile=16, alpha=0.01, beta=0.05, gamma=0.2),
                   num_shards=1)
    prompt = assemble(ShardSet(tmp_path / "s"), tiny_lm, ["doc03", "doc07", "doc01", "doc09"], "Which fox?")
    dev = torch.device("cuda")
    bits = prompt.bits.to(dev)
    table = BlockTable.for_layout(prompt.layout, 128, 64, device=dev)
    L, H = prompt.layout.seq_len, tiny_lm.n_heads
    be = get_backend(backend, dev)
    densities = []
    for layer in range(tiny_lm.n_layers):
        lists = decode_layer(bits, layer, table)
        densities.append(lists.density())
        q = torch.randn(H, L, 64, device=dev, dtype=torch.bfloat16)  # head_dim 64: what the kernels support
        k, v = (torch.randn(tiny_lm.n_kv_heads, L, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
        ref = block_sparse_attention(q, k, v, lists, 0.125)
        out = be.forward(q, k, v, lists, 0.125)
        assert worst_row(out, ref) < 2e-2, (backend, layer)
    assert min(densities) < 1.0  # the profile really is sparse somewhere


# ---- the whole bundled model on the GPU ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol_gpu():
    return load_model(None, device="cuda")


def _sample_shards(tmp_path, lm, cfg=ProfileConfig()):
    docs = [{"id": name, "title": "", "text": text} for name, text in sample_documents()[:6]]
    profile_corpus(write_jsonl(docs, tmp_path / "c.jsonl"), tmp_path / "s", lm, cfg, num_shards=1)
    return BitStore(tmp_path / "s"), [d["id"] for d in docs]


@pytest.mark.slow
def test_smollm2_cuda_prefill_equals_reference(tmp_path, smol_gpu):
    """The whole model with the cuda backend against the reference backend on the same prompt and lists: inside
    the real forward, every layer's attention equals the fp32 reference on that layer's own inputs row by row;
    the logits agree within bf16 noise compounded over 30 layers, and pick the same token."""
    need_cuda_backend()
    shards, ids = _sample_shards(tmp_path, smol_gpu)
    prompt = assemble(shards, smol_gpu, ids[:5], "Which module parses command-line options?")
    x = torch.tensor([prompt.input_ids], device="cuda")
    # the same lists for both: query blocks set, not each backend's choice
    for block_m, cut in ((64, "segment"), (128, "segment"), (64, "grid")):
        opts = PrefillOptions(block_m=block_m, query_blocks=cut)
        bits, table = prompt_tensors(prompt, opts, smol_gpu.device)
        plan = prepare_sparse(smol_gpu, bits, table, CudaBackend(), "cuda")
        worst = []

        def checked(layer, q, k, v, scale, attend=plan.attend_model, lists=plan.block_lists):
            out = attend(layer, q, k, v, scale)  # the model's layouts: [1, H, L, D] in, [1, L, H, D] out
            want = block_sparse_attention(q[0].float(), k[0].float(), v[0].float(), lists[layer], scale)
            got = out[0].transpose(0, 1).float()
            worst.append(float(((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-20)).max()))
            return out

        assert plan.attend_model is not None  # the path the model's forward takes
        plan.attend_model = checked
        with torch.inference_mode():
            run_forward(smol_gpu, x, sparse_attention(smol_gpu.model, plan))
        assert len(worst) == smol_gpu.n_layers and max(worst) < ROW_BOUND, (block_m, cut, worst)
        cuda = sparse_prefill(smol_gpu, prompt, CudaBackend(), x, opts, "cuda")
        ref = sparse_prefill(smol_gpu, prompt, ReferenceBackend(), x, opts, "torch")
        assert cuda.plan.block_lists[0].density() < 1.0 and cuda.plan.table.block_m == block_m
        assert cuda.plan.table.query_blocks == cut
        diff, scale = float((cuda.logits - ref.logits).abs().max()), float(ref.logits.abs().max())
        # measured on five prompts: 0.3-0.75 of a 32 scale for cuda and FlexAttention alike (bf16 attention)
        assert diff < 0.03 * scale, (block_m, cut, diff, scale)
        assert int(cuda.logits.argmax()) == int(ref.logits.argmax())


@pytest.mark.slow
def test_smollm2_every_bit_set_equals_dense(tmp_path, smol_gpu):
    need_cuda_backend()
    shards, ids = _sample_shards(tmp_path, smol_gpu, ProfileConfig(alpha=0.0, beta=0.0, gamma=0.0))
    prompt = assemble(shards, smol_gpu, ids[:4], "Which module reads CSV files?")
    x = torch.tensor([prompt.input_ids], device="cuda")
    dense = dense_prefill(smol_gpu, x).logits
    run = sparse_prefill(smol_gpu, prompt, CudaBackend(), x, PrefillOptions(), "cuda")
    assert all(b.density() == 1.0 for b in run.plan.block_lists)
    diff = float((dense - run.logits).abs().max())
    scale = float(dense.abs().max())
    assert diff < 0.02 * scale, (diff, scale)  # bf16 rounding: the kernel and cuDNN round differently
    top2 = dense.topk(2).values
    if float(top2[0] - top2[1]) > 2 * diff:  # the first token is decided beyond rounding: both must pick it
        assert int(dense.argmax()) == int(run.logits.argmax())


@pytest.mark.slow
def test_cuda_graphs_replay_equals_eager_across_prompts(tmp_path, smol_gpu):
    """A captured SIFT prefill (the staged bits' copy, decode and forward) replays to logits identical to eager
    SIFT's, for two prompts of different lengths, each replay restaging its prompt, and the report says so."""
    need_cuda_backend()
    from sift_cli.prefill.graphs import graphed_sparse_prefill

    shards, ids = _sample_shards(tmp_path, smol_gpu)
    backend = CudaBackend()
    for docs, q in ((ids[:2], "What does csv do?"), (ids[1:6], "Which module handles dates and times?")):
        prompt = assemble(shards, smol_gpu, docs, q)
        opts = for_prompt(PrefillOptions(), backend, smol_gpu.head_dim, prompt.bits)
        x = torch.tensor([prompt.input_ids], device="cuda")
        eager = sparse_prefill(smol_gpu, prompt, backend, x, opts, "cuda").logits
        graph = graphed_sparse_prefill(smol_gpu, prompt, backend, x, opts, "cuda", repeat=2)
        assert graph.transfer_ms > 0 and graph.lookup_ms > 0  # each replay looks the bits up in the store again
        for i in range(2):
            if i:  # the graph's own copy refills what the decode reads
                graph.staged.device_buf.zero_()
            logits, _ = graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(logits.float(), eager), (len(prompt.input_ids), float((logits - eager).abs().max()))
    r = run_prefill(smol_gpu, prompt, PrefillOptions(cuda_graphs=True, repeat=2, warmup=1, max_new_tokens=4))
    assert r["graph_logits_equal_eager"] and r["cuda_graphs"] and r["capture_ms"]["sift"] > 0
    assert 0 < r["sift"]["lookup_ms"] < r["sift"]["ttft_ms"]
    assert r["sift"]["gpu_ms"] > 0 and r["density"]["cells_over_allowed"] >= 1.0


def test_graphed_full_recompute_equals_eager(tmp_path, smol_gpu):
    """Full recompute captured in a graph makes eager's causal SDPA call (not the masked one transformers builds
    under capture), so its logits equal eager full recompute's."""
    from sift_cli.prefill.graphs import GraphedPrefill

    shards, ids = _sample_shards(tmp_path, smol_gpu)
    prompt = assemble(shards, smol_gpu, ids[:4], "What does csv do?")
    x = torch.tensor([prompt.input_ids], device="cuda")
    eager = dense_prefill(smol_gpu, x).logits
    logits, _ = GraphedPrefill(smol_gpu, x).replay()
    torch.cuda.synchronize()
    assert torch.equal(logits.float(), eager), float((logits.float() - eager).abs().max())


def test_prompt_without_bits_runs_full_recompute_eager_and_graphed(tmp_path, smol_gpu):
    """Documents no set holds have no bits: eager and graphed SIFT both run full recompute's forward, so their
    logits equal full recompute's, and the report says so."""
    from sift_cli.corpus import Document

    shards, _ = _sample_shards(tmp_path, smol_gpu)
    docs = [Document(f"new-{i}", text, "test") for i, (_, text) in enumerate(sample_documents()[6:9])]
    prompt = assemble(shards, smol_gpu, docs, "What does csv do?")
    assert prompt.bits.without_bits()
    for graphs in (False, True):
        r = run_prefill(smol_gpu, prompt, PrefillOptions(cuda_graphs=graphs, repeat=2, warmup=1, max_new_tokens=4))
        assert r["causal_kernel"] and r["max_abs_logit_diff"] == 0.0 and r["density"]["blocks"] == 1.0, graphs
        if not graphs:  # graphed, both modes restage the prompt's ids
            assert r["sift"]["transfer_ms"] == 0.0
        else:
            assert r["graph_logits_equal_eager"]


def test_dense_lists_equal_for_both_query_block_cuts():
    """With every block listed, segment-cut and grid query blocks compute the same (dense) function."""
    lay = random_prompt(np.random.default_rng(1), 64, doc_lengths=[200, 77], prefix_len=16, suffix_len=30)[0].layout
    for qmode in ("segment", "grid"):
        t = BlockTable.for_layout(lay, 128, 64, qmode, device="cuda")
        assert dense_block_lists(t, 2).density() == 1.0
