"""The reference backend's banded mode equals its full computation; the gather backend (the CPU default) computes
the reference's function too, on random lists and on lists decoded over document-aligned tables."""

import numpy as np
import pytest
import torch

from sift_cli.attention.backends import get_backend
from sift_cli.attention import gather
from sift_cli.attention.gather import gathered_attention
from sift_cli.attention.reference import ReferenceBackend, banded_block_sparse_attention, block_sparse_attention
from sift_cli.block_lists import block_lists_from_mask, decode_layer, dense_block_lists
from sift_cli.block_table import BlockTable
from sift_cli.lab.eval.backend import eval_backend

from ..test_block_lists import AWKWARD, random_prompt


def random_lists(L, bm, bn, H, seed):
    table = BlockTable.causal(L, bm, bn)
    torch.manual_seed(seed)
    M, N = table.n_query_blocks, table.n_kv_blocks
    causal = torch.arange(N)[None, :] <= table.last_causal_kv_block()[:, None]
    mask = ((torch.rand(H, M, N) < 0.4) | table.needs_mask()[None]) & causal[None]
    return block_lists_from_mask(mask, table)


@pytest.mark.parametrize("L,bm,bn,H,Hkv,rows", [(200, 128, 64, 4, 2, 128), (333, 64, 64, 6, 3, 64),
                                                 (129, 128, 128, 2, 2, 512)])
def test_banded_reference_equals_reference(L, bm, bn, H, Hkv, rows):
    lists = random_lists(L, bm, bn, H, L)
    q, k, v = torch.randn(H, L, 16), torch.randn(Hkv, L, 16), torch.randn(Hkv, L, 16)
    a = banded_block_sparse_attention(q, k, v, lists, 0.3, rows=rows)
    b = block_sparse_attention(q, k, v, lists, 0.3)
    assert torch.allclose(a, b, atol=2e-6), (a - b).abs().max()
    banded = eval_backend("reference", torch.device("cpu"))
    assert isinstance(banded, ReferenceBackend) and banded.rows is not None


@pytest.mark.parametrize("L,bm,bn,H,Hkv", [(1, 128, 64, 2, 1), (200, 128, 64, 4, 2), (333, 64, 64, 6, 3),
                                           (129, 128, 128, 2, 2), (1000, 128, 64, 9, 3)])
def test_gather_equals_reference_on_random_lists(L, bm, bn, H, Hkv):
    lists = random_lists(L, bm, bn, H, L + 1)
    q, k, v = torch.randn(H, L, 16), torch.randn(Hkv, L, 16), torch.randn(Hkv, L, 16)
    ref, ref_lse = block_sparse_attention(q, k, v, lists, 0.3, return_lse=True)
    out, lse = gathered_attention(q, k, v, lists, 0.3, return_lse=True)
    assert torch.allclose(out, ref, atol=2e-6) and torch.allclose(lse, ref_lse, atol=2e-5)
    assert torch.allclose(gathered_attention(q, k, v, lists, 0.3), ref, atol=2e-6)


@pytest.mark.parametrize("prefix,docs,suffix", AWKWARD)
@pytest.mark.parametrize("query_blocks", ["segment", "grid"])
def test_gather_equals_reference_on_document_tables(prefix, docs, suffix, query_blocks):
    rng = np.random.default_rng(prefix + len(docs))
    pb, _ = random_prompt(rng, 64, n_layers=1, n_heads=6, doc_lengths=docs, prefix_len=prefix, suffix_len=suffix)
    table = BlockTable.for_layout(pb.layout, 128, 64, query_blocks)
    lists = decode_layer(pb, 0, table)
    L = pb.layout.seq_len
    q, k, v = torch.randn(6, L, 32), torch.randn(2, L, 32), torch.randn(2, L, 32)
    ref = block_sparse_attention(q, k, v, lists, 0.2)
    assert torch.allclose(gathered_attention(q, k, v, lists, 0.2), ref, atol=3e-6)
    dense = dense_block_lists(table, 6)  # every block: the one-call dense path
    assert torch.allclose(gathered_attention(q, k, v, dense, 0.2), block_sparse_attention(q, k, v, dense, 0.2),
                          atol=3e-6)


@pytest.mark.parametrize("prefix,docs,suffix", AWKWARD + [(24, [700, 300, 65], 33)])
@pytest.mark.parametrize("chunk", [256, 64])
def test_gather_segment_calls_equal_reference(prefix, docs, suffix, chunk, monkeypatch):
    """Lists shaped like real ones: even heads list every own block of their segment (one causal run per segment)
    and drop KV blocks of earlier segments the same way for all of a segment's query blocks (one call over its
    rows); odd heads also drop own blocks per query block (the per-block paths); head 0 drops nothing before the
    second document and head 2 nothing at all (leading segments as one causal run). Causal runs go in chunks of
    `chunk` rows."""
    monkeypatch.setattr(gather, "CAUSAL_CHUNK", chunk)
    rng = np.random.default_rng(prefix + sum(docs))
    pb, _ = random_prompt(rng, 64, n_layers=1, n_heads=6, doc_lengths=docs, prefix_len=prefix, suffix_len=suffix)
    table = BlockTable.for_layout(pb.layout, 128, 64)
    kv_end = table.kv_start + table.kv_len
    seg_of_q = table.kv_doc[torch.searchsorted(table.kv_start, table.q_start)]
    seg_start = torch.stack([table.kv_start[table.kv_doc == d].min() for d in seg_of_q.tolist()])
    causal = torch.arange(table.n_kv_blocks)[None, :] <= table.last_causal_kv_block()[:, None]
    cross = kv_end[None, :] <= seg_start[:, None]
    own_far = ~cross & (kv_end[None, :] <= table.q_start[:, None])
    drop_cross = torch.from_numpy(rng.random((6, 1, table.n_kv_blocks)) < 0.4)
    drop_own = torch.from_numpy(rng.random((6, table.n_query_blocks, table.n_kv_blocks)) < 0.3)
    drop_own[0::2] = False
    second_doc = table.kv_start[table.kv_doc == 1].min() if (table.kv_doc == 1).any() else table.seq_len
    drop_cross[0, :, table.kv_start < second_doc] = False
    drop_cross[2] = False
    mask = causal[None] & ~(drop_cross & cross[None]) & ~(drop_own & own_far[None])
    lists = block_lists_from_mask(mask, table)
    L = pb.layout.seq_len
    q, k, v = torch.randn(6, L, 32), torch.randn(2, L, 32), torch.randn(2, L, 32)
    ref, ref_lse = block_sparse_attention(q, k, v, lists, 0.2, return_lse=True)
    out, lse = gathered_attention(q, k, v, lists, 0.2, return_lse=True)
    assert torch.allclose(out, ref, atol=3e-6) and torch.allclose(lse, ref_lse, atol=2e-5)


def test_auto_is_gather_on_cpu():
    assert get_backend("auto", torch.device("cpu")).name == "gather"
    assert get_backend("reference", torch.device("cpu")).name == "reference"


def _poisoned_empty(monkeypatch):
    """torch.empty that returns NaNs (or -1 for integers): any output cell left unwritten shows."""
    real = torch.empty

    def empty(*args, **kw):
        t = real(*args, **kw)
        return t.fill_(float("nan") if t.is_floating_point() else -1)

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("L", [1, 63, 65, 127, 129, 1000])
@pytest.mark.parametrize("threads", [1, 2])
def test_headwise_gather_equals_reference_at_awkward_sizes(L, threads, monkeypatch):
    """The backend's forward (heads spread over a thread pool) at awkward lengths, into poisoned outputs."""
    from sift_cli.attention.gather import GatherBackend

    lists = random_lists(L, 128, 64, 9, L + 7)
    q, k, v = torch.randn(9, L, 16), torch.randn(3, L, 16), torch.randn(3, L, 16)
    ref, ref_lse = block_sparse_attention(q, k, v, lists, 0.3, return_lse=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _poisoned_empty(monkeypatch)
        out, lse = GatherBackend().forward(q, k, v, lists, 0.3, return_lse=True)
        with torch.inference_mode():  # as in a prefill: the workers run in the caller's mode
            plain = GatherBackend().forward(q, k, v, lists, 0.3)
    finally:
        monkeypatch.undo()
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before  # the pool restores PyTorch's thread count
    assert torch.allclose(out, ref, atol=2e-6) and torch.allclose(lse, ref_lse, atol=2e-5)
    assert torch.allclose(plain, ref, atol=2e-6)
