"""Profiling throughput and sparse-prefill TTFT of the
bundled SmolLM2 on real essays, on whatever GPU this runs on. Prints a compact table last; JSON to --out.

    python experiments/prefill_breakdown.py --gguf /tmp/w/SmolLM2-135M-Instruct.Q4_1.gguf --data DIR --out F
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from sift_cli.attention import integration
from sift_cli.attention.backends import get_backend
from sift_cli.block_table import BlockTable
from sift_cli.config import GPU_DEFAULTS, ProfileConfig
from sift_cli.corpus import load_documents
from sift_cli.lab.datasets import essay_records, long_essays, write_jsonl
from sift_cli.models import load_model
from sift_cli.prefill.assemble import assemble
from sift_cli.prefill.lookup import open_set
from sift_cli.prefill.options import PrefillOptions
from sift_cli.prefill.plan import decode_all_layers
from sift_cli.prefill.report import run_prefill
from sift_cli.profile.forward import causal_sdpa
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.inspection import inspect_shards
from sift_cli.tokens import prefix_token_ids, tokenize_documents

ON_GPU = asdict(GPU_DEFAULTS)  # the batch and statistics budget of a GPU run


def essays_cut(data, words):
    return long_essays(essay_records(data, words), words)


def joined_docs(data, n_docs, words):
    """Long documents made of consecutive whole essays, cut at `words` words."""
    recs = essay_records(data, 100000)
    out, buf, i = [], [], 0
    while len(out) < n_docs and i < len(recs):
        buf.extend(recs[i]["text"].split(" "))
        i += 1
        if len(buf) >= words:
            out.append({"id": f"joined{len(out)}", "title": "", "text": " ".join(buf[:words])})
            buf = []
    return out


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.inference_mode()
def dense_throughput(lm, prefix, docs_tokens, repeat=3):
    base = lm.model.model
    for d in docs_tokens[:2]:
        base(input_ids=torch.tensor([prefix + d], device=lm.device), use_cache=False)
    _sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for d in docs_tokens:
            base(input_ids=torch.tensor([prefix + d], device=lm.device), use_cache=False)
        _sync()
        times.append(time.perf_counter() - t)
    return sum(len(d) for d in docs_tokens) / statistics.median(times)


def profile_case(lm, name, records, work):
    corpus = write_jsonl(records, work / f"{name}.jsonl")
    cfg = ProfileConfig(**ON_GPU)
    # warm-up on a throwaway directory (allocator, kernels)
    profile_corpus(corpus, work / f"{name}-warm", lm, cfg, num_shards=1)
    _sync()
    rep = profile_corpus(corpus, work / f"{name}-shards", lm, cfg, num_shards=1)
    docs = load_documents(corpus)
    toks = tokenize_documents(lm.tokenizer, docs)
    dense = dense_throughput(lm, prefix_token_ids(lm.tokenizer), toks)
    s = inspect_shards(work / f"{name}-shards")
    return {"case": name, "docs": rep.profiled, "mean_tokens": rep.tokens / max(1, rep.profiled),
            "profile_tok_s": rep.tokens_per_second, "dense_prefill_tok_s": dense,
            "profile_over_dense": rep.tokens_per_second / dense,
            "shard_bytes_per_doc": s["bytes_per_document"], "kv_bytes_per_doc": s["kv_cache_bytes_bf16"] / s["documents"],
            "la_density": s["la_density"], "ca_density": s["ca_density"]}


def ttft_cases(lm, data, work, repeat, limit=0):
    recs = essays_cut(data, 300 if limit else 1450)[: 2 if limit else 12]
    corpus = write_jsonl(recs, work / "essays.jsonl")
    profile_corpus(corpus, work / "essay-shards", lm, ProfileConfig(**ON_GPU),
                   num_shards=1)
    shards = open_set(work / "essay-shards")
    rows = []
    for n_docs, label in ((2, "4K"), (4, "8K"))[: 1 if limit else 2]:
        for start in (0, 4)[: 1 if limit else 2]:
            ids = [r["id"] for r in recs[start:start + n_docs]]
            prompt = assemble(shards, lm, ids, "What is the main argument of the first essay?")
            for backend in (("reference",) if limit else ("flex", "cuda")):
                try:
                    r = run_prefill(lm, prompt, PrefillOptions(backend=backend, repeat=repeat, max_new_tokens=16))
                    rows.append({"prompt": label, "docs": ids, "backend": backend,
                                 "tokens": r["prompt_tokens"]["total"], "density_blocks": r["density"]["blocks"],
                                 "density_cells": r["density"]["cells"], "dense_ms": r["dense"]["ttft_ms"],
                                 "sift_ms": r["sift"]["ttft_ms"], "forward_ms": r["sift"]["forward_ms"],
                                 "decode_ms": r["decode_ms"], "transfer_ms": r["sift"]["transfer_ms"],
                                 "speedup": r["speedup"], "first_token_match": r["first_token_match"],
                                 "kl": r["kl"], "same_answer": r["same_answer"]})
                except Exception as exc:  # keep going: report what failed
                    rows.append({"prompt": label, "backend": backend, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def attention_breakdown(lm, data, work, limit=0):
    """Where SIFT's forward time goes at 8K: per-layer kernel time (events) vs host time, against dense SDPA."""
    recs = essays_cut(data, 300 if limit else 1450)[: 2 if limit else 4]
    shards = open_set(work / "essay-shards")
    prompt = assemble(shards, lm, [r["id"] for r in recs], "What is the main argument of the first essay?")
    L, H, Hkv, D = prompt.layout.seq_len, lm.n_heads, lm.n_kv_heads, lm.head_dim
    bits = prompt.bits.to(lm.device)
    table = BlockTable.for_layout(prompt.layout, 128, 64, device=lm.device)
    block_lists = decode_all_layers(bits, table, lm.n_layers, "cuda")[0]
    g = torch.Generator(device=lm.device).manual_seed(0)
    q = torch.randn(1, L, H, D, device=lm.device, dtype=torch.bfloat16, generator=g).transpose(1, 2)
    k = torch.randn(1, L, Hkv, D, device=lm.device, dtype=torch.bfloat16, generator=g).transpose(1, 2)
    v = torch.randn(1, L, Hkv, D, device=lm.device, dtype=torch.bfloat16, generator=g).transpose(1, 2)
    rows = {"L": L, "density": sum(x.computed_blocks() for x in block_lists) / sum(x.causal_blocks() for x in block_lists)}

    def timed(fn, n=5):
        fn()
        _sync()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        walls, gpus = [], []
        for _ in range(n):
            t = time.perf_counter()
            ev[0].record()
            fn()
            ev[1].record()
            host = time.perf_counter() - t
            _sync()
            walls.append(host * 1e3)
            gpus.append(ev[0].elapsed_time(ev[1]))
        return statistics.median(gpus), statistics.median(walls)

    def dense():
        for _ in block_lists:
            causal_sdpa(q, k, v, D ** -0.5)  # the model's stock SDPA path (GQA inside the kernel)

    rows["dense_sdpa_30_layers_ms"], rows["dense_host_ms"] = timed(dense)

    # Does a launch wait for queued GPU work? Queue ~50 ms of sleep, then time the host side of one call.
    def host_ms_behind_sleep(fn):
        fn()
        _sync()
        torch.cuda._sleep(100_000_000)
        t = time.perf_counter()
        fn()
        host = (time.perf_counter() - t) * 1e3
        _sync()
        return host

    try:
        be = get_backend("cuda", lm.device)
        rows["cuda_one_call_host_ms_behind_50ms_sleep"] = host_ms_behind_sleep(
            lambda: be.forward(q[0], k[0], v[0], block_lists[0], D ** -0.5))
        from sift_cli.cuda.runtime import TensorMapTemplate
        tpl = TensorMapTemplate(q[0], 128)
        rows["tma_retarget_host_ms_behind_sleep"] = host_ms_behind_sleep(lambda: tpl.point(q[0].data_ptr()))
    except Exception as exc:
        rows["sync_probe_error"] = f"{type(exc).__name__}: {exc}"[:300]
    for name in ("cuda", "flex"):
        try:
            be = get_backend(name, lm.device)
            attend = be.prepare(table, block_lists)

            def sparse(attend=attend):
                for layer in range(len(block_lists)):
                    attend(layer, q[0], k[0], v[0], D ** -0.5)

            rows[f"{name}_30_layers_ms"], rows[f"{name}_host_ms"] = timed(sparse)
        except Exception as exc:
            rows[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    # whole forwards: stock SDPA, the integration running SDPA itself, the integration with each sparse backend

    class SdpaThroughIntegration:
        name = "sdpa-via-integration"

        def forward(self, q_, k_, v_, blocks, scale, return_lse=False):
            g_ = q_.shape[0] // k_.shape[0]
            return F.scaled_dot_product_attention(q_[None], k_[None], v_[None], is_causal=True, scale=scale,
                                                  enable_gqa=g_ > 1)[0]

    masks_seen = []
    original = integration.sift_attention_forward

    def spy(module, query, key, value, attention_mask, *a, **kw):
        masks_seen.append(attention_mask is not None)
        return original(module, query, key, value, attention_mask, *a, **kw)

    integration.sift_attention_forward = spy
    ids = torch.tensor([prompt.input_ids], device=lm.device)

    def whole(plan=None):
        def fn():
            with torch.inference_mode():
                if plan is None:
                    lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
                else:
                    with integration.sparse_attention(lm.model, plan):
                        lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return fn

    rows["forward_sdpa_ms"], rows["forward_sdpa_host_ms"] = timed(whole(), 10)
    rows["forward_sdpa_via_integration_ms"], _ = timed(whole(integration.prepare_plan(SdpaThroughIntegration(), table,
                                                                                      block_lists)), 10)
    for name in ("cuda", "flex"):
        try:
            rows[f"forward_{name}_ms"], rows[f"forward_{name}_host_ms"] = timed(
                whole(integration.prepare_plan(get_backend(name, lm.device), table, block_lists)), 10)
        except Exception as exc:
            rows[f"forward_{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    rows["attention_mask_passed"] = any(masks_seen)
    integration.sift_attention_forward = original
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-profile", action="store_true", help="skip the profiling-throughput cases")
    ap.add_argument("--limit", type=int, default=0, help="documents per case (0: all); for smoke tests")
    args = ap.parse_args()
    os.environ.setdefault("SIFT_CACHE_DIR", "/tmp/sift-cache")

    result = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__}
    t = time.time()
    lm = load_model(args.gguf, device=args.device)
    lim = (lambda xs: xs[: args.limit]) if args.limit else (lambda xs: xs)
    result["load_s"] = time.time() - t
    work = Path(tempfile.mkdtemp(prefix="sift-gpu-"))
    result["profile"] = []
    cases = () if args.skip_profile else (("essays-1K", lim(essays_cut(args.data, 750)[:24])),
                                          ("joined-8K", lim(joined_docs(args.data, 4, 600 if args.limit else 5000))))
    for name, recs in cases:
        try:
            result["profile"].append(profile_case(lm, name, recs, work))
        except Exception as exc:
            traceback.print_exc()
            result["profile"].append({"case": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(result["profile"][-1]), flush=True)
    result["ttft"] = ttft_cases(lm, args.data, work, args.repeat, args.limit)
    try:
        result["breakdown"] = attention_breakdown(lm, args.data, work, args.limit)
    except Exception as exc:
        traceback.print_exc()
        result["breakdown"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print("\n== profiling throughput (H200, bf16 model, fp32 statistics) ==")
    for r in result["profile"]:
        if "error" in r:
            print(r)
            continue
        print(f"{r['case']:>10}: {r['docs']} docs x {r['mean_tokens']:.0f} tok  profile {r['profile_tok_s']:,.0f} tok/s  "
              f"dense {r['dense_prefill_tok_s']:,.0f} tok/s  ratio {r['profile_over_dense']:.2f}  "
              f"shard {r['shard_bytes_per_doc']:,.0f} B/doc vs KV {r['kv_bytes_per_doc']:,.0f} B/doc")
    print("== TTFT, SmolLM2 essays (T=64, 128x64 blocks) ==")
    for r in result["ttft"]:
        if "error" in r:
            print(r)
            continue
        print(f"{r['prompt']} {r['tokens']:>5} tok {r['backend']:>4}: density {r['density_blocks']:.3f}  dense "
              f"{r['dense_ms']:.2f} ms  sift {r['sift_ms']:.2f} ms (fwd {r['forward_ms']:.2f}, decode "
              f"{r['decode_ms']:.2f})  x{r['speedup']:.2f}  first {r['first_token_match']}  KL {r['kl']:.1e}")
    print("== attention only, 30 layers at the 8K prompt's masks (GPU ms by events, host ms to enqueue) ==")
    print(json.dumps(result["breakdown"]))


if __name__ == "__main__":
    sys.exit(main())
