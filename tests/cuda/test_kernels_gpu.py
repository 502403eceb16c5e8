"""The bundled kernels on a Hopper GPU: attention equals the fp32 reference row by row (poisoned outputs, LSE,
repeat-identical), decode equals block_lists.decode_layer (order included) and the kernel's tiles
coalesce_reference, on plain causal prompts at awkward
lengths and on document-aligned tables of awkward segments, with query blocks of 128 and of 64 rows."""

import numpy as np
import pytest
import torch

from sift_cli.block_lists import decode_layer
from sift_cli.block_table import BlockTable
from sift_cli.cuda.checks import (attention_case, awkward_layouts, decode_case, document_layout, random_block_lists,
                                  random_case_bits, tiles_match)

pytestmark = [pytest.mark.gpu, pytest.mark.hopper]

LENGTHS = (1, 63, 65, 127, 129, 1000, 8192 + 17)
VARIANTS = [dict(), dict(split=False), dict(pair=False),  # pair=False only changes 64-key tables
            dict(extra={"TILE_SLOTS": 2}),  # what a prompt too long for three staged lists runs
            dict(extra={"OVERLAP": 0}),  # each tile on its own, as 64-row tiles with 128-key steps run
            dict(l2_heads=1),  # tiles regrouped one KV head at a time, as long prompts run (work_order.l2_group)
            dict(merge=False)]  # a tile per listed block, not runs re-cut into full tiles (cuda/coalesce.py)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("block_m", [128, 64])
@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("density", [1.0, 0.3])
@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_attention_matches_reference(head_dim, block_n, block_m, L, density, ratio):
    if L > 4096 and ratio != 4:
        pytest.skip("long case runs once per config")
    h_kv = 1 if L > 4096 else 2
    H = ratio * h_kv
    seed = hash((head_dim, block_n, block_m, L, density, ratio)) % 10_000
    blocks = random_block_lists(BlockTable.causal(L, block_m, block_n, device="cuda"), H, density, seed=seed)
    for variant in VARIANTS:
        r = attention_case(H, h_kv, head_dim, blocks, seed=seed + 1, std=3.0 if L % 2 else 1.0,
                           out_layout=("LHD", "HLD", "unaligned")[seed % 3], **variant)
        assert r["ok"], r  # every row within bound, poisoned buffers fully written, LSE, repeat-identical


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("block_m", [128, 64])
@pytest.mark.parametrize("query_blocks", ["segment", "grid"])
def test_attention_on_document_tables(head_dim, block_n, block_m, query_blocks):
    rng = np.random.default_rng(head_dim + block_n)
    for prefix, docs, suffix in awkward_layouts():
        bits = random_case_bits(rng, 64, n_layers=1, n_heads=6, doc_lengths=docs, prefix_len=prefix,
                                suffix_len=suffix, la_p=0.25, ca_p=0.15)
        table = BlockTable.for_layout(bits.layout, block_m, block_n, query_blocks)
        blocks = decode_layer(bits, 0, table).to("cuda")
        for variant in VARIANTS:
            r = attention_case(6, 2, head_dim, blocks, seed=3, std=2.0, **variant)
            assert r["ok"], (prefix, docs, suffix, r)


@pytest.mark.parametrize("block_m", [128, 64])
def test_backend_and_plan_on_model_layout(block_m):
    """q/k/v as transposed views of [L, H, D] (what a model produces) go straight to TMA; the backend's per-prompt
    plan writes the model's [L, H, D] layout; both equal the reference."""
    import math

    from sift_cli.attention.cuda import CudaBackend
    from sift_cli.attention.reference import block_sparse_attention

    L, H, H_kv, D = 777, 6, 2, 128
    q = torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    k = torch.randn(L, H_kv, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    v = torch.randn(L, H_kv, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    table = BlockTable.causal(L, block_m, 64, device="cuda")
    blocks = random_block_lists(table, H, 0.3, seed=1)
    scale = 1 / math.sqrt(D)
    out, lse = CudaBackend().forward(q, k, v, blocks, scale, return_lse=True)
    ref, ref_lse = block_sparse_attention(q.float(), k.float(), v.float(), blocks, scale, True)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    assert float((lse - ref_lse).abs().max()) < 1e-3
    attend = CudaBackend().prepare(table, [blocks, blocks])
    for layer in (0, 1):
        o = attend(layer, q, k, v, scale)
        assert o.transpose(0, 1).is_contiguous()  # [L, H, D] memory: o_proj reads it as is
        assert torch.equal(o, out)
    # the attention function's layouts ([1, H, L, D] in, [1, L, H, D] out), mixed with the [H, L, D] calls and
    # with inputs the kernel cannot read as they are (an odd start: copied, then the fast path again)
    model = CudaBackend().prepare(table, [blocks, blocks])
    odd = torch.empty(L * H * D + 1, device="cuda", dtype=torch.bfloat16)[1:].view(L, H, D).transpose(0, 1)
    odd.copy_(q)
    for query in (q[None], q[None], odd[None], q[None]):
        o = model.model_layout(1, query, k[None], v[None], scale)
        assert o.shape == (1, L, H, D) and o.is_contiguous() and torch.equal(o[0].transpose(0, 1), out)
        assert torch.equal(model(0, q, k, v, scale), out)


def test_plan_regrouped_for_l2_captures_in_a_graph():
    """A plan built inside a CUDA graph capture (as a graphed prefill builds it) with its tiles regrouped one KV
    head at a time replays to the output of the eager plan in plain longest-first order, bit for bit."""
    import math

    from sift_cli.cuda.plan import SparseAttentionPlan

    L, H, H_kv, D = 1000, 8, 4, 128
    q = torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    k = torch.randn(L, H_kv, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    v = torch.randn(L, H_kv, D, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    blocks = random_block_lists(BlockTable.causal(L, 64, 64, device="cuda"), H, 0.4, seed=7)
    scale = 1 / math.sqrt(D)

    def plan(l2_heads):
        return SparseAttentionPlan(blocks.table, blocks.offsets[None], blocks.indices[None], H, H_kv, D, scale,
                                   l2_heads=l2_heads)

    eager = plan(H_kv)(0, q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan(1)(0, q, k, v)  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan(1)
        out = captured(0, q, k, v)
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(captured.work["tile_order"], plan(H_kv).work["tile_order"])  # the order did change
    assert torch.equal(out, eager)


def test_two_64_row_ctas_fit_an_sm():
    """64-row query blocks over 64-key tables run two persistent CTAs per SM up to 64K tokens (the driver says so)."""
    from sift_cli.cuda.attention import kernel_config, persistent_ctas
    from sift_cli.cuda.runtime import sm_count

    dev = torch.device("cuda")
    for d in (64, 128):
        assert persistent_ctas(kernel_config(d, 64, block_m=64), 65536 // 64 + 256, dev) == 2 * sm_count(dev)
        assert persistent_ctas(kernel_config(d, 64), 65536 // 64 + 256, dev) == sm_count(dev)


@pytest.mark.parametrize("tile", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("query_blocks", ["segment", "grid"])
def test_decode_kernel_matches_pytorch(tile, block_n, query_blocks):
    rng = np.random.default_rng(tile * 7 + block_n)
    for i in range(4):
        r = decode_case(random_case_bits(rng, tile), block_n, query_blocks, block_m=64 if i % 2 else 128)
        assert r["ok"], r


def test_decode_kernel_awkward_and_long():
    rng = np.random.default_rng(5)
    cases = [random_case_bits(rng, 64, doc_lengths=docs, prefix_len=p, suffix_len=s, la_p=0.2, ca_p=0.5)
             for p, docs, s in awkward_layouts()]
    cases.append(random_case_bits(rng, 64, n_layers=2, n_heads=12, doc_lengths=[2048] * 7 + [333], prefix_len=50,
                                  suffix_len=100, la_p=0.27, ca_p=0.06))
    for bits in cases:
        for bn in (64, 128):
            for bm in (128, 64):
                r = decode_case(bits, bn, block_m=bm)
                assert r["ok"], r


def test_tiles_of_rows_past_1024_blocks():
    """coalesce.cu stages a row's listed blocks 32 bitmap words (1,024 blocks) at a time: rows reaching past that
    take several batches, the runs carried across them (prompts of 70K-140K tokens, 64-key blocks)."""
    tables = [BlockTable.causal(70000, 64, 64, device="cuda"), BlockTable.causal(140000, 128, 64, device="cuda"),
              BlockTable.for_layout(document_layout(np.random.default_rng(3), 70000, 100, 700), 64, 64,
                                    device="cuda")]
    for i, table in enumerate(tables):
        assert table.n_kv_blocks > 1024
        for density in (1.0, 0.3, 0.97):
            blocks = random_block_lists(table, 1, density, seed=i)
            assert all(tiles_match(blocks.offsets[None], blocks.indices[None], table, per_step=2)), (i, density)


def test_tensor_map_template_copied_from_the_cache_equals_a_fresh_encode():
    """A descriptor re-used from the cache for a view of the same shape and strides at another address is the one
    the driver encodes for that address, byte for byte."""
    from sift_cli.cuda.runtime import TensorMapTemplate, address_patchable, encode_tensor_map

    base = torch.empty(3, 1000, 128, device="cuda", dtype=torch.bfloat16)
    other = torch.empty(3, 1000, 128, device="cuda", dtype=torch.bfloat16)
    for box in (64, 128):
        first, second = TensorMapTemplate(base, box), TensorMapTemplate(other, box)
        for t, tpl in ((base, first), (other, second)):
            fresh = encode_tensor_map(t.data_ptr(), tuple(t.shape), tuple(t.stride()), box)
            assert bytes(tpl.map) == bytes(fresh)
        second.point(base.data_ptr())
        assert bytes(second.map) == bytes(first.map) or not address_patchable(base.device.index)
