"""Where split-KV should start: the attention kernel alone with rows cut at the work order's cap (total blocks /
persistent CTAs, the default), at half of it (the rule before), and never, beside cuDNN dense; GPU time from CUDA
graphs of 20 calls (no host launch cost, which hides short kernels), interleaved rounds, median; outputs compared,
and each variant's tile count (the rows plus one per extra part: where two variants both count just the rows, nothing
is split and their work orders are the same, so their times differ only by the run's noise).

Layouts: an NQ-shaped prompt (SmolLM2's 9/3 heads at D 64, ~2.9K tokens of 100-190-token passages, every bit set)
with segment and grid query blocks, the same passages at 8K, causal 11 % at 16K, documents with bits at the paper's
densities at 16K (SmolLM2's heads) and at 16K and 32K (the 8B model's 32/8 heads, D 128); 64-row query blocks over
64-key tables (the cuda backend's default below 48K tokens).

    python experiments/split_cap.py --out split_cap.json
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from sift_cli.block_table import BlockTable
from sift_cli.cuda.attention import persistent_ctas
from sift_cli.cuda.checks import document_layout, random_block_lists
from sift_cli.cuda.coalesce import KernelLists
from sift_cli.cuda.decode import CudaDecoder, WorkSpec
from sift_cli.cuda.plan import SparseAttentionPlan
from sift_cli.cuda.work_order import SPLIT_MAX, SPLIT_MIN_BLOCKS
from sift_cli.lab.bench.attention_kernels import cudnn_dense_fn, document_case, model_layout_inputs
from sift_cli.lab.bench.kernel_timing import graph_time_us
from sift_cli.layout import random_prompt_bits


def graph_us(fn) -> float:
    return graph_time_us(fn, reps=30, calls=20)


def all_bits_lists(H: int, L: int, query_blocks: str):
    layout = document_layout(np.random.default_rng(L), L, 100, 190, prefix_len=16, suffix_len=32)
    bits = random_prompt_bits(layout, 64, 1, H, 1.0, 1.0, np.random.default_rng(0))[0].to("cuda")
    return CudaDecoder(bits, BlockTable.for_layout(layout, 64, 64, query_blocks=query_blocks)).layer(0)


def cases():
    yield "9/3/64 2.9K NQ-shaped, segment", (9, 3, 64), lambda: all_bits_lists(9, 2872, "segment")
    yield "9/3/64 2.9K NQ-shaped, grid", (9, 3, 64), lambda: all_bits_lists(9, 2872, "grid")
    yield "9/3/64 8K passages, segment", (9, 3, 64), lambda: all_bits_lists(9, 8192, "segment")
    for H, H_kv, D in ((9, 3, 64), (32, 8, 128)):
        yield (f"{H}/{H_kv}/{D} 16K causal 11 %", (H, H_kv, D),
               lambda H=H: random_block_lists(BlockTable.causal(16384, 64, 64, device="cuda"), H, 0.1, seed=1))
    yield "9/3/64 16K documents 450-650", (9, 3, 64), lambda: document_case(9, 16384, 64, 0, (450, 650), 64)[0]
    for L in (16384, 32768):
        yield (f"32/8/128 {L // 1024}K documents 300-3000", (32, 8, 128),
               lambda L=L: document_case(32, L, 64, 0, (300, 3000), 64)[0])


def plan_with_cap(blocks, H: int, H_kv: int, D: int, scale: float, cap_ctas: float | None):
    """The plan, its work order cut at total / (cap_ctas · CTAs) (None: never split)."""
    args = (blocks.table, blocks.offsets[None], blocks.indices[None], H, H_kv, D, scale)
    if cap_ctas is None:
        return SparseAttentionPlan(*args, split=False)
    plan = SparseAttentionPlan(*args)
    if cap_ctas == 1:
        return plan
    ctas = persistent_ctas(plan.cfg, blocks.table.n_kv_blocks, plan.device)
    spec = WorkSpec(plan.cfg.per_step, int(cap_ctas * ctas), SPLIT_MAX, SPLIT_MIN_BLOCKS)
    return SparseAttentionPlan(*args, tiles=KernelLists(blocks.offsets[None], blocks.indices[None], blocks.table,
                                                        spec))


VARIANTS = {"cap = total / CTAs": 1, "cap = total / (2 CTAs)": 2, "no split": None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="split_cap.json")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name, (H, H_kv, D), make in cases():
        blocks = make()
        L = blocks.table.seq_len
        q, k, v = model_layout_inputs(H, H_kv, L, D)
        scale = 1 / math.sqrt(D)
        fns, outs, tiles = {"cudnn": cudnn_dense_fn(q, k, v, scale)[0]}, {}, {}
        for variant, cap_ctas in VARIANTS.items():
            plan = plan_with_cap(blocks, H, H_kv, D, scale, cap_ctas)
            tiles[variant] = int(plan.work["n_active"].reshape(-1)[0])  # the rows, plus one per extra part
            out = outs[variant] = torch.empty(L, H, D, dtype=torch.bfloat16, device="cuda").transpose(0, 1)
            fns[variant] = lambda p=plan, o=out: p(0, q, k, v, out=o)
        times = {n: [] for n in fns}
        for _ in range(args.rounds):
            for n, f in fns.items():
                times[n].append(graph_us(f))
        t = {n: float(np.median(v)) for n, v in times.items()}
        default = outs["cap = total / CTAs"].float()
        row = {"case": name, "tokens": L, "cudnn_us": t["cudnn"],
               **{f"{n} us": t[n] for n in VARIANTS}, **{f"{n} tiles": tiles[n] for n in VARIANTS},
               **{f"{n} max |out - default|": float((outs[n].float() - default).abs().max())
                  for n in VARIANTS if n != "cap = total / CTAs"}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'case':36} {'cuDNN':>8} " + " ".join(f"{n:>24}" for n in VARIANTS))
    for r in rows:
        print(f"{r['case']:36} {r['cudnn_us']:8.1f} " + " ".join(f"{r[f'{n} us']:24.1f}" for n in VARIANTS))


if __name__ == "__main__":
    main()
