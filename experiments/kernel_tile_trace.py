"""Where the attention kernel's time goes per tile: diagnostic builds of kernels/sparse_attn_fwd.cu timed beside the
default on the same inputs and lists.

    python experiments/kernel_tile_trace.py --tokens 16384,32768 --out kernel_tile_trace.json

- `TRACE=1`: per-tile clock64 stamps from thread 0 of consumer warpgroup 0 (tile start, end of its steps, before
  and after the epilogue). A tile's cycle (start to the next tile's start on the same CTA) is fitted as
  a + b * steps: b is the cost of a pipeline step, a what each tile adds beyond its steps.
- `TRACE=2`: cycles each consumer warpgroup waits, by kind (K or V landed, pingpong turn, S or P V GEMM done, Q
  landed, tile staged, epilogue), as a share of its time in the tile loop. A build times only some kinds
  (`TRACE_WAITS`): timing the P V wait needs registers the consumers do not have, so that build spills (its
  numbers are marked); the others spill 16 bytes or nothing.
- `ABLATE_SAME_KV=1`: every step loads its head's first K/V block (wrong results): what the K/V traffic costs.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from sift_cli.cuda.attention import attention_defines
from sift_cli.cuda.plan import SparseAttentionPlan
from sift_cli.cuda.runtime import compiled_module
from sift_cli.lab.bench.attention_kernels import (block_lists_flops, cudnn_dense_fn, model_layout_inputs, time_ms,
                                                  variant_layouts)

TRACE_CAP = 1 << 16  # kernel macro TRACE_CAP
WAIT_KINDS = ("K landed", "turn", "V landed", "S done", "PV done", "Q landed", "tile staged", "epilogue")
WAIT_BUILDS = (0x0F, 0xE0, 0x10)  # K, turn, V, S | Q, tile, epilogue | PV (spills)


def kernel_globals(plan: SparseAttentionPlan, extra: dict):
    """The compiled module the plan launches (its globals hold the diagnostic counters)."""
    defines, _ = attention_defines(plan.cfg, plan.table.n_kv_blocks, extra)
    return compiled_module("sparse_attn_fwd.cu", defines, plan.device.index)


def device_array(mod, name: str, n: int, dtype):
    import cupy as cp
    return cp.ndarray((n,), dtype, memptr=mod.get_global(name))


def run_once(plan, q, k, v, reset):
    out = torch.empty(q.shape[1], q.shape[0], q.shape[2], dtype=torch.bfloat16, device=q.device).transpose(0, 1)
    plan(0, q, k, v, out=out)  # compiled and warm
    torch.cuda.synchronize()
    reset()
    plan(0, q, k, v, out=out)
    torch.cuda.synchronize()


def tile_records(plan, q, k, v) -> np.ndarray:
    mod = kernel_globals(plan, {"TRACE": 1})
    buf = device_array(mod, "sift_trace", TRACE_CAP * 8, np.uint64)
    count = device_array(mod, "sift_trace_n", 1, np.uint32)
    run_once(plan, q, k, v, lambda: count.fill(0))
    n = min(int(count.get()[0]), TRACE_CAP)
    return buf[: 8 * n].get().reshape(-1, 8)


def tile_model(r: np.ndarray) -> dict:
    """Fit of a tile's cycle against its steps, and the medians of its phases."""
    end = ((r[:, 0] >> 29) & 1).astype(bool)
    tiles, ends = r[~end], r[end]
    steps = (tiles[:, 0] & 0x7FFF).astype(np.int64)
    cta = (tiles[:, 0] >> 40).astype(np.int64)
    c0, c1, c2, c3 = (tiles[:, i].astype(np.int64) for i in (2, 3, 4, 5))
    end_clock = dict(zip((ends[:, 0] >> 40).astype(np.int64).tolist(), ends[:, 2].astype(np.int64).tolist()))
    cycle = np.zeros(len(tiles), np.int64)
    for c in np.unique(cta):
        idx = np.where(cta == c)[0]
        idx = idx[np.argsort(c0[idx])]
        cycle[idx] = np.append(c0[idx[1:]], end_clock[c]) - c0[idx]
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones(len(steps)), steps], 1).astype(float), cycle.astype(float),
                                 rcond=None)
    long_tiles = steps > 2
    return dict(tiles=int(len(tiles)), mean_steps=float(steps.mean()), a_cycles=float(a), b_cycles=float(b),
                step_in_loop=float(np.median((c1 - c0)[long_tiles] / (steps[long_tiles] - 1))),
                boundary_step=float(np.median(c2 - c1)), epilogue=float(np.median(c3 - c2)),
                to_next_tile=float(np.median(c0 + cycle - c3)))


def wait_shares(plan, q, k, v, mask: int) -> list[dict]:
    extra = {"TRACE": 2, "TRACE_WAITS": mask}
    mod = kernel_globals(plan, extra)
    acc = device_array(mod, "sift_wait", 18, np.uint64)
    run_once(plan, q, k, v, lambda: acc.fill(0))
    a = acc.get().astype(float).reshape(2, 9)
    return [{WAIT_KINDS[i]: a[w, i] / a[w, 8] for i in range(8) if (mask >> i) & 1} for w in range(2) if a[w, 8]]


def one_case(q, k, v, blocks, H, H_kv, D, cudnn_tflops) -> dict:
    scale = 1 / math.sqrt(D)

    def plan(extra):
        return SparseAttentionPlan(blocks.table, blocks.offsets[None], blocks.indices[None], H, H_kv, D, scale,
                                   extra=extra)

    builds = {"default": {}, "same K/V block": {"ABLATE_SAME_KV": 1}, "TRACE=1": {"TRACE": 1}}
    builds.update({f"TRACE=2 {m:#04x}": {"TRACE": 2, "TRACE_WAITS": m} for m in WAIT_BUILDS})
    plans = {name: plan(extra) for name, extra in builds.items()}
    outs = {name: torch.empty(q.shape[1], H, D, dtype=torch.bfloat16, device=q.device).transpose(0, 1)
            for name in builds}
    ms = {name: time_ms(lambda p=p, o=outs[name]: p(0, q, k, v, out=o)) for name, p in plans.items()}
    flops = block_lists_flops(blocks, D)
    row = dict(ms=ms, pct_cudnn={n: 100 * flops / t / 1e9 / cudnn_tflops for n, t in ms.items()},
               tiles=tile_model(tile_records(plans["TRACE=1"], q, k, v)))
    waits = [{} for _ in range(2)]
    for m in WAIT_BUILDS:
        for w, shares in enumerate(wait_shares(plans[f"TRACE=2 {m:#04x}"], q, k, v, m)):
            waits[w].update(shares)
    row["waits"] = [w for w in waits if w]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="16384,32768")
    ap.add_argument("--shape", default="32/8/128", help="H/H_kv/D")
    ap.add_argument("--block-m", default="128,64", help="query block sizes")
    ap.add_argument("--out", default="kernel_tile_trace.json")
    args = ap.parse_args(argv)
    H, H_kv, D = (int(x) for x in args.shape.split("/"))
    rows = []
    for L in (int(t) for t in args.tokens.split(",")):
        q, k, v = model_layout_inputs(H, H_kv, L, D, seed=L + D)
        run, _ = cudnn_dense_fn(q, k, v, 1 / math.sqrt(D))
        cudnn = 4 * D * H * L * (L + 1) // 2 / time_ms(run) / 1e9
        print(f"{H}/{H_kv}/{D} L={L}: cuDNN {cudnn:.0f} TFLOP/s", flush=True)
        for block_n in (128, 64):
            for block_m in (int(b) for b in args.block_m.split(",")):
                for name, blocks in variant_layouts(H, H_kv, D, L, block_n, block_m).items():
                    r = one_case(q, k, v, blocks, H, H_kv, D, cudnn)
                    rows.append(dict(H=H, H_kv=H_kv, D=D, L=L, block_n=block_n, block_m=block_m, layout=name, **r))
                    t, p = r["tiles"], r["pct_cudnn"]
                    print(f"  KV {block_n:3d} rows {block_m:3d} {name:12s} % cuDNN: "
                          + " ".join(f"{n} {v_:.0f}" for n, v_ in p.items()), flush=True)
                    print(f"    tile cycle = {t['a_cycles']:.0f} + {t['b_cycles']:.0f} x steps (mean steps "
                          f"{t['mean_steps']:.1f}); in the loop {t['step_in_loop']:.0f}/step, boundary step "
                          f"{t['boundary_step']:.0f}, epilogue {t['epilogue']:.0f}, to next tile "
                          f"{t['to_next_tile']:.0f}", flush=True)
                    for w, shares in enumerate(r["waits"]):
                        print(f"    warpgroup {w} waits: " + ", ".join(f"{n} {100 * s:.1f}%" for n, s in
                                                                      shares.items()), flush=True)
        del q, k, v
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
