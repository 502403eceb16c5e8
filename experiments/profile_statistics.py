"""Profiling at corpus scale, in one device run of about 4 minutes on one H200:

1. the Triton statistics path against the torch reference path, bit for bit, on real SmolLM2 documents (NQ
   passages and essays); any differing bit is explained with its fp64 distance to the threshold;
2. the statistics kernels alone against SDPA's attention forward on the same q/k (SmolLM2 and Llama-3-8B shapes);
3. the profile bench (`sift bench profile`, `sift_cli.lab.bench.profile`): dense prefill vs the whole `sift profile` run with each
   statistics path, for SmolLM2 on NQ passages and essays and a Llama-3-8B-shaped random-weight model on 2K- and
   8K-token documents.

    python experiments/profile_statistics.py --gguf /path/SmolLM2-135M-Instruct.Q4_1.gguf --data DIR \
        --out $OUT/profile-statistics.json

A failing part or case is reported and the run goes on. JSON to --out (also written after each part); a compact
table is printed last.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from sift_cli.config import GPU_DEFAULTS, ProfileConfig
from sift_cli.corpus import CorpusFormat, load_documents
from sift_cli.lab.bench import profile as bp
from sift_cli.lab.bench.attention_kernels import time_ms
from sift_cli.lab.bench.profile import essay_case_records, nq_case_records
from sift_cli.lab.datasets import write_jsonl
from sift_cli.lab.eval.probe import probe_forward
from sift_cli.models import load_model
from sift_cli.profile import triton_statistics as st
from sift_cli.profile.batches import plan_batches
from sift_cli.profile.forward import causal_sdpa, profile_batch
from sift_cli.profile.job import profile_corpus
from sift_cli.profile.statistics import doc_attention_bits
from sift_cli.tokens import prefix_token_ids, tokenize_documents

ON_GPU = asdict(GPU_DEFAULTS)  # the batch and statistics budget of a GPU run
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def elapsed() -> float:
    return time.time() - T0


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------------------
# 1. bits: triton vs torch on real documents
# ----------------------------------------------------------------------------------------------------------

def capture_qk(model, ids: list[int], layer: int):
    """Post-RoPE q [H, S, D] and k [H_kv, S, D] of one layer for one sequence, from the same dense forward as the
    profiling forward (the evaluation probe)."""
    got = {}

    def grab(at, q, k, scale):
        if at == layer:
            got["q"], got["k"], got["scale"] = q.clone(), k.clone(), scale

    probe_forward(model, ids, grab)
    return got["q"], got["k"], got["scale"]


def explain(model, prefix, doc, layer, cfg, fast, ref):
    """fp64 distances to the thresholds of the bits that differ in one layer (rounding ties are ~1e-6)."""
    q, k, scale = capture_qk(model, prefix + doc, layer)
    P, n, T = len(prefix), len(doc), cfg.tile
    g = q.shape[0] // k.shape[0]
    kk = k.double().repeat_interleave(g, 0)[:, : P + n]
    s = (q.double()[:, P: P + n] @ kk.transpose(1, 2)) * scale
    mask = torch.arange(P + n, device=s.device)[None, :] > (P + torch.arange(n, device=s.device))[:, None]
    A = torch.softmax(s.masked_fill(mask, float("-inf")), -1)[:, :, P:]  # [H, n, n] doc block
    causal = ~mask[:, P:]
    out = []
    la_diff = (fast.la_tiles[layer] != ref.la_tiles[layer]).nonzero().tolist()
    for h, r, c in la_diff[:5]:
        blk = A[h, r * T:(r + 1) * T, c * T:(c + 1) * T].masked_fill(~causal[r * T:(r + 1) * T, c * T:(c + 1) * T],
                                                                     -1)
        m = float(blk.max())
        out.append({"kind": "LA", "head": h, "tile": [r, c], "fast": bool(fast.la_tiles[layer][h, r, c]),
                    "tile_max": m, "rel_to_alpha": abs(m - cfg.alpha) / cfg.alpha})
    ca_diff = (fast.ca_pages[layer] != ref.ca_pages[layer]).nonzero().tolist()
    for h, p in ca_diff[:5]:
        cols = slice(p * T, min(n, (p + 1) * T))
        a = A[h][:, cols].masked_fill(~causal[:, cols], -1)
        near_beta = float(((a[a >= 0] - cfg.beta).abs() / cfg.beta).min())
        visible = (n - torch.arange(cols.start, cols.stop, device=a.device)).double()
        conc = (a >= cfg.beta).sum(0).double() / visible
        out.append({"kind": "CA", "head": h, "page": p, "fast": bool(fast.ca_pages[layer][h, p]),
                    "nearest_p_rel_to_beta": near_beta,
                    "nearest_count_to_gamma_boundary": float(((conc - cfg.gamma).abs() * visible).min())})
    return out


def bits_check(lm, data, n_nq=24, n_essays=4, fast_stats="triton"):
    recs = nq_case_records(data, n_nq) + essay_case_records(data, n_essays)
    corpus = write_jsonl(recs, Path(tempfile.mkdtemp(prefix="sift-bits-")) / "docs.jsonl")
    toks = tokenize_documents(lm.tokenizer, load_documents(corpus))
    prefix = prefix_token_ids(lm.tokenizer)
    result = {"docs": len(toks), "tokens": sum(map(len, toks)), "per_tile": []}
    for tile in (64, 16):
        cfg_fast = ProfileConfig(tile=tile, stats=fast_stats, **ON_GPU)
        cfg_ref = ProfileConfig(tile=tile, stats="torch", **ON_GPU)
        same_docs, la_diff, ca_diff, la_bits, ca_bits, details = 0, 0, 0, 0, 0, []
        t_fast = t_ref = 0.0
        for batch in plan_batches([len(t) for t in toks], len(prefix), GPU_DEFAULTS.batch_tokens):
            group = [toks[i] for i in batch]
            sync()
            t = time.perf_counter()
            fast = profile_batch(lm.model, prefix, group, cfg_fast)
            sync()
            t_fast += time.perf_counter() - t
            t = time.perf_counter()
            ref = profile_batch(lm.model, prefix, group, cfg_ref)
            sync()
            t_ref += time.perf_counter() - t
            for doc, f, r in zip(group, fast, ref):
                dl = int((f.la_tiles != r.la_tiles).sum())
                dc = int((f.ca_pages != r.ca_pages).sum())
                la_bits += f.la_tiles.numel()
                ca_bits += f.ca_pages.numel()
                la_diff, ca_diff = la_diff + dl, ca_diff + dc
                same_docs += int(dl == 0 and dc == 0 and f.pack() == r.pack())
                if (dl or dc) and len(details) < 6:
                    layers = sorted({int(x) for x in (f.la_tiles != r.la_tiles).nonzero()[:, 0].tolist()}
                                    | {int(x) for x in (f.ca_pages != r.ca_pages).nonzero()[:, 0].tolist()})
                    for layer in layers[:2]:
                        try:
                            details.append({"doc_tokens": len(doc), "layer": layer,
                                            "bits": explain(lm.model, prefix, doc, layer, cfg_ref, f, r)})
                        except Exception as exc:
                            details.append({"layer": layer, "error": f"{type(exc).__name__}: {exc}"[:200]})
        result["per_tile"].append({"tile": tile, "docs_identical": same_docs, "la_bits_differing": la_diff,
                                   "la_bits": la_bits, "ca_bits_differing": ca_diff, "ca_bits": ca_bits,
                                   "triton_s": round(t_fast, 3), "torch_s": round(t_ref, 3), "mismatches": details})
        log(f"bits T={tile}: {same_docs}/{len(toks)} docs identical, LA {la_diff}/{la_bits} bits differ, "
            f"CA {ca_diff}/{ca_bits}; profile_batch triton {t_fast:.2f}s vs torch {t_ref:.2f}s")
    return result


# ----------------------------------------------------------------------------------------------------------
# 2. statistics kernels vs SDPA on the same q/k
# ----------------------------------------------------------------------------------------------------------

def kernel_timing():
    def ms(fn, reps=10):
        return time_ms(fn, warmup=1, reps=reps)

    rows = []
    for name, B, H, Hkv, D, n in (("SmolLM2 32x2K", 32, 9, 3, 64, 2048), ("SmolLM2 400x160", 400, 9, 3, 64, 160),
                                  ("8B 1x8K", 1, 32, 8, 128, 8192), ("8B 8x2K", 8, 32, 8, 128, 2048)):
        try:
            P = 30
            q = torch.randn(B, H, P + n, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, Hkv, P + n, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            cfg = ProfileConfig(tile=64)
            lens = [n] * B
            lens_dev = torch.tensor(lens, dtype=torch.int32, device="cuda")
            scale = D ** -0.5
            t_sdpa = ms(lambda: causal_sdpa(q, k, v, scale))  # the profiling forward's own SDPA call
            t_thr = ms(lambda: st.row_thresholds(q, k, P, lens_dev, n, scale, cfg.alpha, cfg.beta))
            t_all = ms(lambda: st.batch_attention_bits(q, k, P, lens, scale, cfg, lengths_dev=lens_dev))
            t_ref = ms(lambda: [doc_attention_bits(q[b], k[b], P, n, scale, cfg) for b in range(min(B, 4))],
                       reps=3) * B / min(B, 4)
            rows.append({"shape": name, "sdpa_ms": t_sdpa, "triton_thresholds_ms": t_thr,
                         "triton_total_ms": t_all, "torch_reference_ms": t_ref})
            log(f"kernels {name}: sdpa {t_sdpa:.3f} ms, triton stats {t_all:.3f} ms (thresholds {t_thr:.3f}), "
                f"torch reference {t_ref:.1f} ms")
            del q, k, v
        except Exception as exc:
            traceback.print_exc()
            rows.append({"shape": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


# ----------------------------------------------------------------------------------------------------------
# 4. where a SmolLM2 profile run spends its time
# ----------------------------------------------------------------------------------------------------------

def where_time_goes(lm, data, n_docs: int, work: Path, top: int = 30, stats: str = "triton") -> str:
    """One whole NQ-passage profile run (Triton stats) under cProfile (host time by function), then one under the
    torch profiler (GPU time by kernel); both as text."""
    corpus = write_jsonl(nq_case_records(data, n_docs), work / "nq-prof.jsonl")
    cfg = ProfileConfig(stats=stats, **ON_GPU)
    text = io.StringIO()

    def run(dest):
        if dest.exists():
            shutil.rmtree(dest)
        sync()
        t = time.perf_counter()
        rep = profile_corpus(corpus, dest, lm, cfg, CorpusFormat(), docs_per_shard=1000)
        sync()
        return rep, time.perf_counter() - t

    rep, wall = run(work / "nq-prof-warm")
    text.write(f"warm run: {rep.tokens} tokens, {rep.tokens_per_second:,.0f} tok/s, wall {wall:.3f} s\n")
    pr = cProfile.Profile()
    pr.enable()
    rep, wall = run(work / "nq-prof-cprofile")
    pr.disable()
    text.write(f"cProfile run: {rep.tokens_per_second:,.0f} tok/s (with profiler overhead), wall {wall:.3f} s\n")
    for key in ("tottime", "cumulative"):
        pstats.Stats(pr, stream=text).sort_stats(key).print_stats(top)

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        rep, wall = run(work / "nq-prof-torch")
    text.write(f"torch.profiler run: wall {wall:.3f} s\n")
    text.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=top))
    return text.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True, help="SmolLM2 .gguf file (or a checkpoint directory)")
    ap.add_argument("--data", required=True, help="folder with nq-open-oracle.jsonl.gz and paul-graham-essays/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=225, help="start no new bench case after this many seconds")
    ap.add_argument("--quick", action="store_true", help="fewer documents everywhere")
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check: torch stats only, a tiny Llama "
                                                          "instead of the 8B, no kernel timing")
    ap.add_argument("--skip-bits", action="store_true", help="skip part 1 (bits check)")
    ap.add_argument("--cases", default="nq,essays,8b-2k,8b-8k", help="bench cases to run (comma-separated)")
    ap.add_argument("--nq-docs", type=int, default=None, help="NQ passages in the bench (default 1000)")
    ap.add_argument("--stats-paths", default="triton,torch", help="statistics paths the bench runs")
    ap.add_argument("--where", default=None, help="write a host/GPU time breakdown of one NQ profile run here")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.quick = True
    os.environ.setdefault("SIFT_CACHE_DIR", "/tmp/sift-cache")

    result = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__}
    try:
        import triton

        result["triton"] = triton.__version__
    except Exception as exc:
        result["triton"] = f"unavailable: {exc}"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        result["elapsed_s"] = round(elapsed(), 1)
        out.write_text(json.dumps(result, indent=2, default=str))

    smol = None
    try:
        smol = load_model(args.gguf, device=device)
        log(f"loaded {smol.name} on {smol.device} ({smol.dtype})")
    except Exception as exc:
        traceback.print_exc()
        result["load_error"] = f"{type(exc).__name__}: {exc}"[:300]
    if smol is not None and not args.skip_bits:
        try:
            result["bits"] = bits_check(smol, args.data, 4 if args.smoke else 8 if args.quick else 24,
                                        1 if args.smoke else 2 if args.quick else 4,
                                        fast_stats="torch" if args.smoke else "triton")
        except Exception as exc:
            traceback.print_exc()
            result["bits"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        save()
    try:
        result["kernels"] = [] if args.smoke else kernel_timing()
    except Exception as exc:
        traceback.print_exc()
        result["kernels"] = [{"error": f"{type(exc).__name__}: {exc}"[:300]}]
    save()

    rows = []
    stats_paths = ("torch",) if args.smoke else tuple(args.stats_paths.split(","))
    if args.where and smol is not None:
        try:
            import tempfile

            Path(args.where).write_text(where_time_goes(smol, args.data, 100 if args.smoke else args.nq_docs or 1000,
                                                        Path(tempfile.mkdtemp(prefix="sift-where-")),
                                                        stats="torch" if args.smoke else "triton"))
            log(f"time breakdown written to {args.where}")
        except Exception as exc:
            traceback.print_exc()
            result["where_error"] = f"{type(exc).__name__}: {exc}"[:300]
    llama_config = None
    if args.smoke:
        llama_config = dict(bp.LLAMA3_8B_CONFIG, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=5000,
                            max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    plan = [("nq", {"nq_docs": 100 if args.smoke else args.nq_docs or (300 if args.quick else 1000)}),
            ("essays", {"essay_docs": 3 if args.smoke else 8 if args.quick else 50}),
            ("8b-2k", {"llama_docs": {"8b-2k": 2 if args.smoke else 4 if args.quick else 16}}),
            ("8b-8k", {"llama_docs": {"8b-8k": 1 if args.quick else 4}})]
    llama = None
    wanted = set(args.cases.split(","))
    for case, kw in plan:
        if case not in wanted:
            continue
        if elapsed() > args.budget_s:
            rows.append({"model": "", "case": case, "error": f"skipped: time budget ({args.budget_s:.0f} s) spent"})
            continue
        if case.startswith("8b") and llama is None:
            if smol is not None:
                smol.model.to("cpu")  # make room; the small model is not needed any more
                smol = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            try:
                t = time.time()
                llama = bp.random_llama(llama_config, device=device,
                                        dtype=torch.float32 if args.smoke else torch.bfloat16)
                log(f"built {llama.name} in {time.time() - t:.1f} s")
            except Exception as exc:
                traceback.print_exc()
                rows.append({"model": bp.LLAMA3_8B_NAME, "case": case, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
        if case in ("nq", "essays") and smol is None:
            rows.append({"model": "SmolLM2", "case": case, "error": result.get("load_error", "model not loaded")})
            continue
        try:
            rows += bp.run_profile_bench(smol=smol, data_dir=args.data, device=device, cases=(case,), log=log,
                                         stats_paths=stats_paths, llama=llama, llama_config=llama_config, **kw)
        except Exception as exc:
            traceback.print_exc()
            rows.append({"model": "", "case": case, "error": f"{type(exc).__name__}: {exc}"[:300]})
        result["bench"] = rows
        save()

    print("\n== Triton statistics vs torch reference (SmolLM2, real documents) ==")
    bits = result.get("bits", {})
    for t in bits.get("per_tile", []):
        print(f"T={t['tile']}: {t['docs_identical']}/{bits['docs']} docs identical; LA bits differing "
              f"{t['la_bits_differing']}/{t['la_bits']}; CA {t['ca_bits_differing']}/{t['ca_bits']}; "
              f"profile_batch triton {t['triton_s']:.2f}s vs torch {t['torch_s']:.2f}s")
        for m in t["mismatches"][:3]:
            print("   mismatch:", json.dumps(m)[:300])
    if "error" in bits:
        print("bits check error:", bits["error"])
    print("== statistics kernels vs SDPA forward (same q/k, bf16, T=64) ==")
    for r in result.get("kernels", []):
        print(r if "error" in r else f"{r['shape']:>16}: sdpa {r['sdpa_ms']:.3f} ms | triton stats "
              f"{r['triton_total_ms']:.3f} ms | torch reference {r['torch_reference_ms']:.1f} ms")
    print("== profile throughput vs dense prefill (document tokens/s) ==")
    print(bp.plain_table(rows))
    print(f"total {elapsed():.0f} s")


if __name__ == "__main__":
    sys.exit(main())
