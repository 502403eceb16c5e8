"""The attention kernel's throughput per computed cell on sparse layouts, beside cuDNN on dense causal attention of
the same work per query row: what a fixed cost per tile leaves of the dense rate when a row computes few keys.

`sift bench kernels` rates the sparse kernel per computed cell against cuDNN dense causal attention over the whole
prompt, where a query tile runs L / 128 steps on average. At ~10 % density a row computes about a tenth of that,
so each tile's fixed costs (its Q load, first scores, epilogue) weigh ten times more. This script times, for each
sparse layout, cuDNN on a batch of causal sequences whose query rows compute the same mean number of keys
(length l = 2·k - 1 for k keys per row, rounded to 64; batch b so the cells match), and reports:

- `sift % full`: the sparse kernel per computed cell against cuDNN dense over the whole prompt (bench kernels'
  measure);
- `cuDNN rows % full`: cuDNN at the layout's row length against cuDNN over the whole prompt, i.e. what cuDNN
  itself keeps of its rate at that granularity;
- `sift % cuDNN rows`: the sparse kernel against cuDNN at the same row length.

GPU time from CUDA graphs of 5 calls (no host launch cost), interleaved rounds, median.

    python experiments/kernel_row_length.py --out kernel_row_length.json
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sift_cli.block_lists import computed_cells
from sift_cli.block_table import BlockTable
from sift_cli.cuda.checks import random_block_lists
from sift_cli.lab.bench.attention_kernels import (DOC_LENGTHS, cudnn_dense_fn, document_case, model_layout_inputs,
                                                   sift_fn)
from sift_cli.lab.bench.kernel_timing import graph_time_us


def graph_us(fn) -> float:
    return graph_time_us(fn, reps=10, calls=5)


def cudnn_batch_fn(b: int, H: int, H_kv: int, length: int, D: int, scale: float):
    """cuDNN causal SDPA over b sequences of `length` tokens, inputs in the model's [b, L, heads, D] layout (the
    batched twin of `cudnn_dense_fn`, which times the whole prompt on the kernel's own inputs)."""
    g = torch.Generator(device="cuda").manual_seed(length + b)
    q = torch.randn(b, length, H, D, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, length, H_kv, D, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    v = torch.randn(b, length, H_kv, D, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)

    run()
    return run


def cases(lengths):
    """(name, (H, H_kv, D), L, block_m, block_n, make lists): the cuda backend's default tables below 48K tokens
    (64-row query blocks over 64-key tables) and the 128-row, 128-key ones, causal ~10 % and document layouts."""
    for L in lengths:
        for (H, H_kv, D) in ((32, 8, 128), (9, 3, 64)):
            for bm, bn in ((64, 64), (128, 128)):
                yield (f"{H}/{H_kv}/{D} {L // 1024}K causal 10 %", (H, H_kv, D), L, bm, bn,
                       lambda L=L, H=H, bm=bm, bn=bn: random_block_lists(BlockTable.causal(L, bm, bn, device="cuda"),
                                                                         H, 0.1, seed=L + bn))
                lo, hi = DOC_LENGTHS[(H, H_kv, D)]
                yield (f"{H}/{H_kv}/{D} {L // 1024}K documents {lo}-{hi}", (H, H_kv, D), L, bm, bn,
                       lambda L=L, H=H, bm=bm, bn=bn, lo=lo, hi=hi: document_case(H, L, bn, L + bn, (lo, hi), bm)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kernel_row_length.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", default="16384,32768")
    args = ap.parse_args()
    rows = []
    for name, (H, H_kv, D), L, bm, bn, make in cases([int(x) for x in args.tokens.split(",")]):
        blocks = make()
        cells = computed_cells(blocks)
        keys_per_row = cells / (H * L)
        length = max(64, 64 * round((2 * keys_per_row - 1) / 64))
        batch = max(1, round(cells / (H * length * (length + 1) / 2)))
        scale = 1 / math.sqrt(D)
        q, k, v = model_layout_inputs(H, H_kv, L, D, seed=L + D)
        fns = {"sift": sift_fn(q, k, v, blocks, scale), "full": cudnn_dense_fn(q, k, v, scale)[0],
               "rows": cudnn_batch_fn(batch, H, H_kv, length, D, scale)}
        times = {n: [] for n in fns}
        for _ in range(args.rounds):
            for n, f in fns.items():
                times[n].append(graph_us(f))
        t = {n: float(np.median(v)) for n, v in times.items()}
        rate = {"sift": cells / t["sift"], "full": H * L * (L + 1) / 2 / t["full"],
                "rows": batch * H * length * (length + 1) / 2 / t["rows"]}
        row = {"case": name, "block_m": bm, "block_n": bn, "keys_per_row": keys_per_row, "cudnn_rows": [batch, length],
               **{f"{n}_us": t[n] for n in t}, "sift_pct_full": 100 * rate["sift"] / rate["full"],
               "rows_pct_full": 100 * rate["rows"] / rate["full"], "sift_pct_rows": 100 * rate["sift"] / rate["rows"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, fns
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'case':36} {'rows':>7} {'keys/row':>8} {'cuDNN rows':>12} {'sift % full':>11} {'cuDNN rows % full':>17} "
          f"{'sift % cuDNN rows':>17}")
    for r in rows:
        print(f"{r['case']:36} {r['block_m']:3}/{r['block_n']:<3} {r['keys_per_row']:8.0f} "
              f"{r['cudnn_rows'][0]:4} x {r['cudnn_rows'][1]:5} {r['sift_pct_full']:11.0f} "
              f"{r['rows_pct_full']:17.0f} {r['sift_pct_rows']:17.0f}")


if __name__ == "__main__":
    main()
