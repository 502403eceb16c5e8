"""The attention kernel alone on document layouts: the kernel's tiles merged from runs of blocks (the default)
against a tile per block, beside cuDNN dense, on the same inputs and lists (timings interleaved, median of three
rounds); SmolLM2's and the 8B model's head shapes, documents short (100-190 tokens, NQ-like passages) and long,
bits all set or drawn at the paper's densities; the outputs of both compared.

    python experiments/kernel_tiles.py --out kernel_tiles.json
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from sift_cli.block_lists import computed_cells
from sift_cli.block_table import BlockTable
from sift_cli.cuda.checks import document_layout
from sift_cli.cuda.decode import CudaDecoder
from sift_cli.lab.bench.attention_kernels import cudnn_dense_fn, model_layout_inputs, sift_fn, time_ms
from sift_cli.lab.bench.prefill_cases import PAPER_CA_DENSITY, PAPER_LA_DENSITY
from sift_cli.layout import random_prompt_bits


def off_diagonal(p: int) -> float:
    """LA probability off the diagonal that gives the paper's LA density over a document of p tiles."""
    total = p * (p + 1) / 2
    return 0.0 if p == 1 else min(1.0, max(0.0, (PAPER_LA_DENSITY * total - p) / (total - p)))


def case(H: int, H_kv: int, D: int, L: int, lo: int, hi: int, block_m: int, bits_kind: str) -> dict:
    rng = np.random.default_rng(L + lo)
    layout = document_layout(rng, L, lo, hi)
    q, k, v = model_layout_inputs(H, H_kv, L, D)
    scale = 1 / math.sqrt(D)
    la, ca = (1.0, 1.0) if bits_kind == "all" else (off_diagonal, PAPER_CA_DENSITY)
    bits = random_prompt_bits(layout, 64, 1, H, la, ca, rng)[0].to("cuda")
    blocks = CudaDecoder(bits, BlockTable.for_layout(layout, block_m, 64)).layer(0)
    cells = computed_cells(blocks)
    fns = {"cudnn": cudnn_dense_fn(q, k, v, scale)[0], "merged": sift_fn(q, k, v, blocks, scale),
           "per_block": sift_fn(q, k, v, blocks, scale, merge=False)}
    a, b = fns["merged"]().float(), fns["per_block"]().float()
    times = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            times[n].append(time_ms(f, reps=20))
    t = {n: float(np.median(v)) for n, v in times.items()}
    causal = H * L * (L + 1) / 2
    return dict(H=H, D=D, L=L, docs=f"{lo}-{hi}", n_docs=len(layout.docs), block_m=block_m, block_n=64,
                bits=bits_kind, cell_density=cells / causal, rel_diff=float((a - b).norm() / b.norm()),
                **{f"{n}_ms": v for n, v in t.items()},
                merged_pct_cudnn_per_cell=100 * (cells / t["merged"]) / (causal / t["cudnn"]),
                per_block_pct_cudnn_per_cell=100 * (cells / t["per_block"]) / (causal / t["cudnn"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kernel_tiles.json")
    args = ap.parse_args()
    cases = [(9, 3, 64, L, lo, hi, 64, kind) for kind in ("all", "paper")
             for L, lo, hi in ((2900, 100, 190), (8192, 450, 650), (16384, 100, 190))]
    cases += [(32, 8, 128, L, 300, 3000, bm, kind) for kind in ("paper", "all") for bm in (64, 128)
              for L in (16384, 32768)]
    cases += [(32, 8, 128, 16384, 100, 190, 128, kind) for kind in ("paper", "all")]
    rows = []
    for c in cases:
        rows.append(case(*c))
        print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    for r in rows:
        print(f"H{r['H']} D{r['D']} {r['L']:>6} docs {r['docs']:>8} bm {r['block_m']:>3} bits {r['bits']:>5}  "
              f"cuDNN {r['cudnn_ms']:.3f}  merged {r['merged_ms']:.3f}  tile per block {r['per_block_ms']:.3f} ms")


if __name__ == "__main__":
    main()
