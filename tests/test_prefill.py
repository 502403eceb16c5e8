"""Prompt assembly, model integration and the dense-vs-SIFT prefill report."""

import json

import pytest
import torch

from sift_cli.attention.backends import get_backend
from sift_cli.attention.reference import ReferenceBackend, block_sparse_attention
from sift_cli.block_lists import block_lists_from_mask, dense_block_lists
from sift_cli.block_table import BlockTable
from sift_cli.config import ProfileConfig
from sift_cli.errors import SiftError
from sift_cli.models import load_model
from sift_cli.prefill.assemble import assemble
from sift_cli.prefill.options import PrefillOptions, for_backend
from sift_cli.prefill.report import run_prefill
from sift_cli.prefill.run import dense_prefill, sparse_prefill
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.reader import ShardSet

from .cli.test_cli import assert_one_line_error, run

EVERYTHING = ProfileConfig(tile=16, alpha=0.0, beta=0.0, gamma=0.0)


@pytest.fixture
def all_bits(tmp_path, tiny_lm, small_corpus):
    out = tmp_path / "all"
    profile_corpus(small_corpus, out, tiny_lm, EVERYTHING, num_shards=2)
    return ShardSet(out)


def test_reference_paths_agree():
    torch.manual_seed(0)
    q, k, v = torch.randn(6, 200, 16), torch.randn(2, 200, 16), torch.randn(2, 200, 16)
    table = BlockTable.causal(200, 128, 64)
    causal = torch.arange(4)[None, :] <= table.last_causal_kv_block()[:, None]
    mask = ((torch.rand(6, 2, 4) < 0.5) | table.needs_mask()[None]) & causal[None]
    lay = block_lists_from_mask(mask, table)
    fast = block_sparse_attention(q, k, v, lay, 0.25)
    slow, lse = block_sparse_attention(q, k, v, lay, 0.25, return_lse=True)
    assert torch.allclose(fast, slow, atol=1e-5) and torch.isfinite(lse).all()


def test_query_block_rows_follow_the_backend_unless_set():
    from sift_cli.attention.cuda import CudaBackend
    from sift_cli.attention.gather import GatherBackend

    assert for_backend(PrefillOptions(), CudaBackend(), 64, 65536).block_m == 64
    assert for_backend(PrefillOptions(), CudaBackend(), 128, 32768).block_m == 64
    assert for_backend(PrefillOptions(), CudaBackend(), 128, 65536).block_m == 128
    assert for_backend(PrefillOptions(), GatherBackend(), 64, 4096).block_m == 512
    assert for_backend(PrefillOptions(), ReferenceBackend(), 64, 4096).block_m == 128
    assert for_backend(PrefillOptions(block_m=128), CudaBackend(), 64, 4096).block_m == 128
    # a prompt with enough unprofiled document tokens (computed densely) takes 128 rows at head_dim 128
    assert for_backend(PrefillOptions(), CudaBackend(), 128, 16384, 0.2).block_m == 128
    assert for_backend(PrefillOptions(), CudaBackend(), 128, 16384, 0.05).block_m == 64
    assert for_backend(PrefillOptions(), CudaBackend(), 64, 16384, 1.0).block_m == 64
    assert for_backend(PrefillOptions(), GatherBackend(), 64, 4096, 1.0).block_m == 512


def test_auto_query_blocks_follow_the_backend_and_the_bits():
    """The CUDA backend cuts nearly dense bits' query blocks on the grid, sparser ones per segment; a backend
    without a choice (gather, reference) and an explicit cut keep theirs."""
    from sift_cli.attention.cuda import CudaBackend
    from sift_cli.attention.gather import GatherBackend

    grid, below = CudaBackend.GRID_SHARE, CudaBackend.GRID_SHARE - 0.01
    assert for_backend(PrefillOptions(), CudaBackend(), 64, 4096, 0.0, grid).query_blocks == "grid"
    assert for_backend(PrefillOptions(), CudaBackend(), 64, 4096, 0.0, below).query_blocks == "segment"
    assert for_backend(PrefillOptions(), GatherBackend(), 64, 4096, 0.0, 1.0).query_blocks == "segment"
    assert for_backend(PrefillOptions(), ReferenceBackend(), 64, 4096, 0.0, 1.0).query_blocks == "segment"
    assert for_backend(PrefillOptions(query_blocks="segment"), CudaBackend(), 64, 4096, 0.0, 1.0
                       ).query_blocks == "segment"
    assert for_backend(PrefillOptions(query_blocks="grid"), CudaBackend(), 64, 4096).query_blocks == "grid"
    # from a prompt's own bits: every bit set against the paper's densities
    import numpy as np

    from sift_cli.layout import PromptLayout, random_prompt_bits
    from sift_cli.prefill.options import for_prompt

    lay = PromptLayout.build(16, ["a", "b", "c"], [100, 300, 600], 5)
    rng = np.random.default_rng(0)
    every = random_prompt_bits(lay, 64, 2, 2, 1.0, 1.0, rng)[0]
    sparse = random_prompt_bits(lay, 64, 2, 2, 0.273, 0.058, rng)[0]
    assert for_prompt(PrefillOptions(), CudaBackend(), 64, every).query_blocks == "grid"
    assert for_prompt(PrefillOptions(), CudaBackend(), 64, sparse).query_blocks == "segment"
    assert for_prompt(PrefillOptions(), CudaBackend(), 64, every).block_m == 64


def test_all_bits_set_equals_dense_to_fp32_rounding(tiny_lm, all_bits):
    ids = ["doc00", "doc07", "doc09", "doc11", "doc03"]
    prompt = assemble(all_bits, tiny_lm, ids, "What jumps over the dog?")
    x = torch.tensor([prompt.input_ids])
    dense_logits = dense_prefill(tiny_lm, x).logits
    for be in (ReferenceBackend(), get_backend("gather", tiny_lm.device)):
        run_ = sparse_prefill(tiny_lm, prompt, be, x, PrefillOptions())
        lists = run_.plan.block_lists
        assert all(b.density() == 1.0 for b in lists)
        assert torch.allclose(dense_logits, run_.logits, atol=1e-4, rtol=1e-5), be.name
        dense = dense_block_lists(run_.plan.table, tiny_lm.n_heads)
        assert torch.equal(lists[0].indices, dense.indices)


def test_sparse_prefill_cache_continues_densely(tiny_lm, all_bits):
    prompt = assemble(all_bits, tiny_lm, ["doc01", "doc09"], "Which zebras jump?")
    r = run_prefill(tiny_lm, prompt, PrefillOptions(backend="reference", repeat=1, max_new_tokens=6, warmup=0))
    assert r["same_answer"] and r["first_token_match"] and r["kl"] < 1e-8
    assert r["density"]["blocks"] == 1.0


def test_prompt_layout_and_checks(tmp_path, tiny_lm, small_corpus, all_bits):
    prompt = assemble(all_bits, tiny_lm, ["doc04", "doc00"], "why?")
    lay = prompt.layout
    assert prompt.input_ids[: lay.prefix_len] == all_bits.prefix_token_ids
    d0 = all_bits.get(["doc04"])[0].tokens
    assert prompt.input_ids[lay.docs[0].start: lay.docs[0].end] == d0
    assert lay.seq_len == len(prompt.input_ids)
    with pytest.raises(SiftError, match="not in the shard set"):
        assemble(all_bits, tiny_lm, ["nope"], "q")
    with pytest.raises(SiftError, match="query is empty"):
        assemble(all_bits, tiny_lm, ["doc00"], "  ")
    with pytest.raises(SiftError, match="more than the model's context"):
        assemble(all_bits, tiny_lm, [f"doc{i:02d}" for i in range(12)] * 3, "q")


def test_other_model_is_refused(tmp_path, all_bits, tiny_ckpt):
    from .helpers import tiny_checkpoint

    other = load_model(str(tiny_checkpoint(tmp_path / "other", seed=9, max_pos=1024)))
    with pytest.raises(SiftError, match="profiled with model"):
        assemble(all_bits, other, ["doc00"], "q")


def test_prefill_cli_json_and_bad_input(tmp_path, tiny_ckpt, all_bits, capsys):
    docs, query = tmp_path / "ids.txt", tmp_path / "q.txt"
    docs.write_text("doc03\ndoc05\n")
    query.write_text("What does the fox do?\n")
    args = ["prefill", "--shards", all_bits.dir, "--docs", docs, "--query", query, "--model", tiny_ckpt,
            "--backend", "reference", "--repeat", "1", "--max-new-tokens", "3"]
    code, stdout, _ = run(capsys, *args, "--json")
    r = json.loads(stdout)
    for key in ("prompt_tokens", "density", "speedup", "decode_ms", "first_token_match", "kl"):
        assert key in r
    for key in ("ttft_ms", "text"):
        assert key in r["dense"] and key in r["sift"]
    code, stdout, _ = run(capsys, *args)
    assert code == 0 and "speed-up" in stdout
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# nothing\n")
    code, _, err = run(capsys, *[empty if a == docs else a for a in args])
    assert_one_line_error(code, err, "no document ids")
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n")
    code, _, err = run(capsys, *[blank if a == query else a for a in args])
    assert_one_line_error(code, err, "query is empty")
    docs.write_text("doc03\nmissing-doc\n")
    code, _, err = run(capsys, *args)
    assert_one_line_error(code, err, "missing-doc")


def test_dense_share_counts_the_unprofiled_documents_tokens():
    import numpy as np

    from sift_cli.layout import PromptLayout, random_prompt_bits

    lay = PromptLayout.build(16, ["a", "b", "c"], [100, 300, 600], 5)
    rng = np.random.default_rng(0)
    assert random_prompt_bits(lay, 64, 2, 2, 0.3, 0.1, rng)[0].dense_share() == 0.0
    assert random_prompt_bits(lay, 64, 2, 2, 0.3, 0.1, rng, dense={1})[0].dense_share() == 0.3
    every = random_prompt_bits(lay, 64, 2, 2, 0.3, 0.1, rng, dense={0, 1, 2})[0]
    assert every.dense_share() == 1.0 and every.without_bits()
    assert not random_prompt_bits(lay, 64, 2, 2, 0.3, 0.1, rng, dense={0, 2})[0].without_bits()


def test_selected_share_counts_set_tiles_and_pages():
    import numpy as np

    from sift_cli.layout import PromptLayout, random_prompt_bits

    lay = PromptLayout.build(16, ["a", "b", "c", "d"], [100, 1, 300, 600], 5)
    rng = np.random.default_rng(3)
    for dense in ((), (2,), (0, 1, 2, 3)):
        bits, drawn = random_prompt_bits(lay, 64, 2, 3, 0.3, 0.4, rng, dense=dense)
        chosen = total = 0
        for span, d in zip(lay.docs, drawn):
            p = -(-span.n_tokens // 64)
            n = 2 * 3 * (p * (p + 1) // 2 + p)
            total += n
            if d is None:
                chosen += n
            else:
                la, ca = d
                chosen += int((la & np.tril(np.ones((p, p), bool))).sum()) + int(ca.sum())
        assert bits.selected_share() == pytest.approx(chosen / total)
    assert bits.selected_share() == 1.0  # every document dense
    assert random_prompt_bits(PromptLayout.build(16, [], [], 5), 64, 2, 3, 0.3, 0.4, rng)[0].selected_share() == 1.0


def test_prompt_without_bits_runs_full_recompute(tiny_lm, all_bits):
    """Documents given as text that no set holds have no bits: SIFT's mask is then the causal mask, and the
    prefill runs full recompute's forward (same logits, bit for bit) with nothing moved or decoded in its time; the
    report's lists still hold every causal block."""
    from sift_cli.corpus import Document

    docs = [Document("new-a", "A fox that nobody profiled jumps.", "test"),
            Document("new-b", "Zebras are not in any set.", "test")]
    prompt = assemble(all_bits, tiny_lm, docs, "Who jumps?")
    assert prompt.bits.without_bits() and len(prompt.bits.dense_docs()) == 2
    x = torch.tensor([prompt.input_ids])
    dense = dense_prefill(tiny_lm, x).logits
    for be in (ReferenceBackend(), get_backend("gather", tiny_lm.device)):
        r = sparse_prefill(tiny_lm, prompt, be, x, for_backend(PrefillOptions(), be, tiny_lm.head_dim,
                                                                len(prompt.input_ids)))
        assert torch.equal(r.logits, dense), be.name
        assert r.transfer_ms == 0.0 and r.prepare_ms == 0.0
        assert all(b.density() == 1.0 for b in r.plan.block_lists)
    report = run_prefill(tiny_lm, prompt, PrefillOptions(backend="gather", repeat=1, warmup=0, max_new_tokens=2))
    assert report["causal_kernel"] and report["same_answer"] and report["max_abs_logit_diff"] == 0.0
    mixed = assemble(all_bits, tiny_lm, [docs[0], "doc01"], "Who jumps?")
    assert not mixed.bits.without_bits()
    assert not run_prefill(tiny_lm, mixed, PrefillOptions(backend="gather", repeat=1, warmup=0,
                                                          max_new_tokens=2))["causal_kernel"]


def test_sift_time_counts_the_lookup_of_its_bits(tmp_path, tiny_lm, small_corpus):
    """Each timed SIFT prefill fetches the prompt's bits from the open store again (its lookup_ms, inside the TTFT),
    and they equal the bits the prompt was assembled with."""
    from sift_cli.prefill.lookup import open_set
    from sift_cli.store.bitstore import BitStore

    out = tmp_path / "set"
    profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=16), num_shards=2)
    store = open_set(out)
    assert isinstance(store, BitStore)
    ids = ["doc03", "doc07", "doc01"]
    prompt = assemble(store, tiny_lm, ids, "What does the fox do?")
    assert prompt.source is not None and torch.equal(prompt.source.fetch().la, prompt.bits.la)
    before = store.stats.lookups
    r = run_prefill(tiny_lm, prompt, PrefillOptions(backend="reference", repeat=2, warmup=1, max_new_tokens=1))
    assert store.stats.lookups - before == len(ids) * 3  # the warm-up and both timed runs
    assert 0 < r["sift"]["lookup_ms"] < r["sift"]["ttft_ms"] and 0 < r["lookup_share_of_ttft"] < 1


def test_a_set_without_a_store_is_read_through_parquet_with_a_hint(tmp_path, tiny_lm, tiny_ckpt, small_corpus,
                                                                   capsys):
    import shutil

    out = tmp_path / "set"
    profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=16), num_shards=2)
    with_store = assemble(ShardSet(out), tiny_lm, ["doc03", "doc07"], "Why?")
    shutil.rmtree(out / "store")  # a set made before the store existed
    docs, query = tmp_path / "ids.txt", tmp_path / "q.txt"
    docs.write_text("doc03\ndoc07\n")
    query.write_text("Why?\n")
    code, stdout, err = run(capsys, "prefill", "--shards", out, "--docs", docs, "--query", query, "--model",
                            tiny_ckpt, "--backend", "reference", "--max-new-tokens", "1", "--json")
    report = json.loads(stdout)
    assert code == 0 and report["store"]["read_path"] == "parquet"
    assert f"sift index {out}" in report["store"]["hints"][0]
    code, _, _ = run(capsys, "index", out)
    assert code == 0
    code, stdout, _ = run(capsys, "prefill", "--shards", out, "--docs", docs, "--query", query, "--model",
                          tiny_ckpt, "--backend", "reference", "--max-new-tokens", "1", "--json")
    again = json.loads(stdout)
    assert again["store"] == {**again["store"], "read_path": "store", "hints": []}
    assert again["metadata_bytes"] == with_store.bits.nbytes() and again["kl"] == report["kl"]
