"""The attention kernel's tile order with and without the regrouping by KV heads for the L2 cache, in one process:
same inputs and lists, interleaved timings, for every table and query block size, on causal and document layouts.

    python experiments/tile_order_l2.py --tokens 16384,32768,49152,65536 --out tile_order_l2.json

"all heads" is the plain longest-first order (every head's tiles mixed); "rule" is what the plan runs
(`sift_cli.cuda.work_order.l2_group` for this GPU's L2); each power of two of KV heads per group is timed too.
The outputs must be equal: the order does not change what a tile computes.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from sift_cli.block_lists import computed_cells
from sift_cli.cuda.plan import SparseAttentionPlan
from sift_cli.cuda.runtime import l2_bytes
from sift_cli.cuda.work_order import l2_group
from sift_cli.lab.bench.attention_kernels import interleaved_ms, variant_cases


def one_case(q, k, v, blocks, groups: list[int], rounds: int) -> dict:
    H, H_kv, L, D = q.shape[0], k.shape[0], q.shape[1], q.shape[2]
    scale = 1 / math.sqrt(D)
    plans = {g: SparseAttentionPlan(blocks.table, blocks.offsets[None], blocks.indices[None], H, H_kv, D, scale,
                                    l2_heads=g) for g in groups}
    outs = {g: torch.empty(L, H, D, dtype=torch.bfloat16, device="cuda").transpose(0, 1) for g in groups}
    fns = {g: (lambda p=plans[g], o=outs[g]: p(0, q, k, v, out=o)) for g in groups}
    for fn in fns.values():
        fn()
    same = all(torch.equal(outs[g], outs[H_kv]) for g in groups)
    ms = interleaved_ms(fns, rounds)
    return {"ms": ms, "equal_outputs": same, "tflops": computed_cells(blocks) * 4 * D / ms[H_kv] / 1e9}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="32768,65536")
    ap.add_argument("--shapes", default="32/8/128,9/3/64", help="H/H_kv/D, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="tile_order_l2.json")
    args = ap.parse_args(argv)
    l2 = l2_bytes(torch.device("cuda"))
    print(f"L2 cache: {l2 / 2**20:.0f} MiB", flush=True)
    rows = []
    shapes = [tuple(int(x) for x in s.split("/")) for s in args.shapes.split(",")]
    for L in (int(t) for t in args.tokens.split(",")):
        for H, H_kv, D, q, k, v, block_n, block_m, name, blocks in variant_cases(shapes, L):
            rule = l2_group(L, D, H_kv, l2)
            groups = sorted({H_kv, rule} | {1 << i for i in range(H_kv.bit_length()) if 1 << i < H_kv})
            r = one_case(q, k, v, blocks, groups, args.rounds)
            ms = r["ms"]
            rows.append(dict(H=H, H_kv=H_kv, D=D, L=L, block_n=block_n, block_m=block_m, layout=name, rule=rule,
                             **r))
            gains = " ".join(f"{g}: {ms[H_kv] / ms[g]:.3f}x" for g in groups if g != H_kv)
            print(f"{H}/{H_kv}/{D} {L:6d} KV {block_n:3d} rows {block_m:3d} {name:12s} all heads "
                  f"{ms[H_kv]:.3f} ms ({r['tflops']:.0f} TF/s); KV heads per group {gains}; rule {rule} "
                  f"{ms[H_kv] / ms[rule]:.3f}x; equal {r['equal_outputs']}", flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0 if all(r["equal_outputs"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
