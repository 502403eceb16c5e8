"""One-call device check for the bundled kernels: compile, correctness sweep, timings of variants.

    python -m sift_cli.lab.bench.kernel_check --out $OUT [--bench quick|full|none]

Writes check.json (every case with its errors), bench.json / bench.md (timings) and a log under --out, and
prints a short summary last; exits 1 when a correctness case fails. The cases (`sift_cli.cuda.checks`) are the ones
the GPU tests assert.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import torch

from ...block_lists import decode_layer
from ...block_table import BlockTable
from ...cuda.attention import paired
from ...cuda.checks import attention_case, awkward_layouts, decode_case, random_block_lists, random_case_bits
from .attention_kernels import (block_lists_flops, markdown, model_layout_inputs, run_kernel_bench, sift_fn,
                                time_ms, variant_layouts)

_LOG = []


def log(*a):
    msg = " ".join(str(x) for x in a)
    _LOG.append(msg)
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------------------
# Sweeps
# ----------------------------------------------------------------------------------------------------------

LENGTHS = (1, 127, 128, 129, 1000, 8192 + 17)
GQA = ((1, 2), (3, 1), (4, 2))  # (ratio, H_kv)


def _variants(block_n: int, head_dim: int, block_m: int) -> list[dict]:
    """The kernel configurations a table runs with: split-KV or not, a tile per block (runs not merged), and for
    64-key blocks the pairing that is not the default."""
    out = [dict(split=True), dict(split=False), dict(merge=False)]
    if block_n == 64:
        out += [dict(pair=not paired(block_n, None, head_dim, block_m), split=True)]
    return out


def attention_sweep() -> list[dict]:
    results = []
    i = 0
    for D, bn, bm in itertools.product((64, 128), (64, 128), (128, 64)):
        for L in LENGTHS:  # plain causal prompts (one segment): dense and 30% of blocks
            table = BlockTable.causal(L, bm, bn, device="cuda")
            for kind, dens in (("dense", 1.0), ("sparse", 0.3)):
                ratio, hkv = GQA[i % len(GQA)]
                i += 1
                if L > 4096:
                    ratio, hkv = (4, 1) if kind == "dense" else (3, 1)
                H = ratio * hkv
                blocks = random_block_lists(table, H, dens, seed=i)
                for var in _variants(bn, D, bm):
                    r = attention_case(H, hkv, D, blocks, seed=1000 + i, std=3.0 if L % 2 else 1.0,
                                       out_layout="LHD" if i % 2 else "HLD", **var)
                    r["mask"] = kind
                    results.append(r)
                    log(_fmt(r))
        rng = np.random.default_rng(D + bn + bm)
        for j, (pre, docs, suf) in enumerate(awkward_layouts()):  # document-aligned tables, decoded bits
            for qmode in ("segment", "grid"):
                bits = random_case_bits(rng, 64, n_layers=1, n_heads=6, doc_lengths=docs, prefix_len=pre,
                                        suffix_len=suf, la_p=0.25, ca_p=0.15)
                blocks = decode_layer(bits, 0, BlockTable.for_layout(bits.layout, bm, bn, qmode)).to("cuda")
                for var in _variants(bn, D, bm):
                    r = attention_case(6, 2, D, blocks, seed=11 + j, **var)
                    r["mask"] = f"documents {j} {qmode}"
                    results.append(r)
                    log(_fmt(r))
    return results


def _fmt(r):
    keys = ("mask", "D", "block_m", "block_n", "H", "H_kv", "L", "density", "variant", "worst_row_rel_err",
            "lse_max_abs_err", "nan_out", "deterministic", "ok")
    return " ".join(f"{k}={r.get(k)}" if not isinstance(r.get(k), float) else f"{k}={r[k]:.3g}" for k in keys)


def decode_sweep() -> list[dict]:
    results = []
    rng = np.random.default_rng(1)
    for tile in (16, 32, 64, 128, 256):
        for bn in (64, 128):
            for qmode in ("segment", "grid"):
                for bm in (128, 64):
                    results.append(decode_case(random_case_bits(rng, tile), bn, qmode, bm))
            log(f"decode tile={tile} bn={bn}: {[r['ok'] for r in results[-4:]]}")
    for pre, docs, suf in awkward_layouts():  # short, misaligned docs, empty prefix/suffix, one-token docs
        bits = random_case_bits(rng, 64, doc_lengths=docs, prefix_len=pre, suffix_len=suf, la_p=0.2, ca_p=0.5)
        for bn, bm in itertools.product((64, 128), (128, 64)):
            results.append(decode_case(bits, bn, block_m=bm))
    bits = random_case_bits(rng, 64, n_layers=2, n_heads=4, doc_lengths=[2048] * 7 + [333], prefix_len=50,
                            suffix_len=100, la_p=0.27, ca_p=0.06)
    for bn, bm in itertools.product((64, 128), (128, 64)):
        results.append(decode_case(bits, bn, block_m=bm))
    special = results[-4 * len(awkward_layouts()) - 4:]
    log(f"decode special cases: {sum(r['ok'] for r in special)} of {len(special)} ok")
    return results


def variant_timings(log=log) -> list[dict]:
    """Time kernel variants (pipeline knobs, 64-row query blocks, the cross-tile overlap) at L = 16K on causal
    layouts (dense and 10% blocks) and a document layout: what each stage costs. Each variant is (query block rows,
    options); a 64-row table has its own lists, so compare TFLOP/s (per computed cell), not ms."""
    rows = []
    L = 16384
    for H, hkv, D in ((32, 8, 128), (9, 3, 64)):
        q, k, v = model_layout_inputs(H, hkv, L, D)
        for bn in (128, 64):
            variants = {"default": (128, {}), "no overlap": (128, dict(extra={"OVERLAP": 0})),
                        "no overlap, two tile slots": (128, dict(extra={"OVERLAP": 0, "TILE_SLOTS": 2})),
                        "no split": (128, dict(split=False)),
                        "stages 2": (128, dict(stages=2)), "stages 3": (128, dict(stages=3)),
                        "64-row": (64, {}), "64-row overlap on": (64, dict(extra={"OVERLAP": 1})),
                        "64-row overlap off": (64, dict(extra={"OVERLAP": 0})),
                        "tile per block": (128, dict(merge=False)), "64-row tile per block": (64, dict(merge=False))}
            if bn == 64:
                variants["unpaired"] = (128, dict(pair=False))
                variants["64-row other pairing"] = (64, dict(pair=not paired(bn, None, D, 64)))
            if bn == 128 and D == 128:  # a one-stage ring leaves room for a second 64-row CTA
                variants["64-row stages 1"] = (64, dict(stages=1))
            if bn == 128:  # stage-removed ablations (wrong results, timing only)
                variants["ablate softmax"] = (128, dict(extra={"ABLATE_SOFTMAX": 1}))
                variants["ablate PV"] = (128, dict(extra={"ABLATE_PV": 1}))
            by_rows = {bm: variant_layouts(H, hkv, D, L, bn, bm) for bm in (128, 64)}
            for layout in by_rows[128]:
                for name, (bm, var) in variants.items():
                    blocks = by_rows[bm][layout]
                    flops = block_lists_flops(blocks, D)
                    try:
                        ms = time_ms(sift_fn(q, k, v, blocks, 1 / math.sqrt(D), **var))
                        rows.append(dict(H=H, D=D, block_m=bm, block_n=bn, layout=layout, variant=name, ms=ms,
                                         tflops=flops / ms / 1e9))
                        log(f"variant H={H} D={D} bn={bn} {layout} {name}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s")
                    except Exception as exc:
                        rows.append(dict(H=H, D=D, block_m=bm, block_n=bn, layout=layout, variant=name,
                                         error=str(exc)[:200]))
                        log(f"variant {name} failed: {exc}")
        del q, k, v
    return rows


def smoke() -> int:
    """One small attention case per configuration: 0 when every one is right."""
    ok = True
    for D, bn, bm in itertools.product((64, 128), (64, 128), (128, 64)):
        for L, dens in ((300, 1.0), (1000, 0.3)):
            try:
                blocks = random_block_lists(BlockTable.causal(L, bm, bn, device="cuda"), 2, dens, 0)
                r = attention_case(2, 1, D, blocks, seed=1)
                r["mask"] = f"density {dens}"
            except Exception as exc:
                r = dict(D=D, block_m=bm, block_n=bn, L=L, ok=False, error=f"{type(exc).__name__}: {exc}")
            ok &= bool(r["ok"])
            log("smoke", _fmt(r) if "error" not in r else r)
    print("SMOKE", "OK" if ok else "FAIL", flush=True)
    return 0 if ok else 1


def check(only: str, report: dict, summary: dict) -> bool:
    """The attention sweep and the decode sweep, into `report`; counts into `summary`. True when all pass."""
    t = time.time()
    att = attention_sweep() if only in ("all", "attention") else []
    report["attention"] = att
    summary["attention_ok"] = f"{sum(r['ok'] for r in att)}/{len(att)}"
    summary["attention_worst_row_rel_err"] = max((r["worst_row_rel_err"] for r in att), default=None)
    log(f"attention sweep {time.time() - t:.0f}s: {summary['attention_ok']} ok")
    t = time.time()
    dec = decode_sweep() if only in ("all", "decode") else []
    report["decode"] = dec
    summary["decode_ok"] = f"{sum(r['ok'] for r in dec)}/{len(dec)}"
    log(f"decode sweep {time.time() - t:.0f}s: {summary['decode_ok']} ok")
    return all(r["ok"] for r in att) and all(r["ok"] for r in dec)


def bench(out: str, quick: bool, flex_budget: float | None) -> None:
    """`sift bench kernels`' table, saved (bench.json, bench.md, log) after every shape."""
    def save(rows):
        with open(os.path.join(out, "bench.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(out, "bench.md"), "w") as f:
            f.write(markdown(rows) + "\n")
        with open(os.path.join(out, "log.txt"), "w") as f:
            f.write("\n".join(_LOG) + "\n")

    rows = run_kernel_bench(quick=quick, time_budget_s=flex_budget, log=log, checkpoint=save)
    save(rows)
    log(markdown(rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--bench", choices=("none", "quick", "full"), default="quick")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="one small attention case per config, then exit")
    ap.add_argument("--only", choices=("all", "attention", "decode"), default="all")
    ap.add_argument("--flex-budget", type=float, default=None, help="stop timing Flex after this many seconds")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    summary = {}
    try:
        import cupy

        log("gpu", torch.cuda.get_device_name(), "torch", torch.__version__, "cupy", cupy.__version__)
    except Exception as exc:
        log("env problem:", exc)
    report = {}
    if args.smoke:
        return smoke()
    passed = True
    try:
        if not args.skip_check:
            passed = check(args.only, report, summary)
    except Exception:
        log("CHECK CRASHED:\n" + traceback.format_exc())
        summary["check_crashed"] = True
        passed = False
    with open(os.path.join(args.out, "check.json"), "w") as f:
        json.dump(report, f, indent=1)
    if args.variants:
        try:
            report["variants"] = variant_timings()
        except Exception:
            log("VARIANTS CRASHED:\n" + traceback.format_exc())
    if args.bench != "none":
        try:
            bench(args.out, args.bench == "quick", args.flex_budget)
        except Exception:
            log("BENCH CRASHED:\n" + traceback.format_exc())
            summary["bench_crashed"] = True
    with open(os.path.join(args.out, "check.json"), "w") as f:
        json.dump(report, f, indent=1)
    summary["seconds"] = round(time.time() - t0)
    with open(os.path.join(args.out, "log.txt"), "w") as f:
        f.write("\n".join(_LOG) + "\n")
    print("SUMMARY", json.dumps(summary))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
