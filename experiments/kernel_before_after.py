"""The attention kernel of another commit beside the current one, in one process: same inputs, same lists,
interleaved timings; what a kernel change gained, free of the ±4 % that separates two device loans.

    git show REV:kernels/sparse_attn_fwd.cu > before.cu
    python experiments/kernel_before_after.py --before before.cu [--before-slots 2] [--tokens 16384] --out ab.json

`--before-slots` is the number of tile slots the older source stages (its shared-memory size depends on it; 2
before commit 8bc20dd). Each case also times the current kernel with `OVERLAP` forced on and off, and reports the
largest difference between the outputs (the kernels compute the same function, so it should be 0 or bf16 rounding).
"""

from __future__ import annotations

import argparse
import json
import math

from sift_cli.block_lists import computed_cells
from sift_cli.cuda import attention as cuda_attention
from sift_cli.cuda import runtime
from sift_cli.lab.bench.attention_kernels import interleaved_ms, sift_fn, variant_cases

BEFORE = "BEFORE_SOURCE"  # a define that selects the other source (never reaches the compiler's meaning)


def use_before_source(text: str) -> None:
    """Compile `text` instead of kernels/sparse_attn_fwd.cu for every configuration whose defines carry BEFORE."""
    current = cuda_attention.compiled_module

    def compiled(name, defines, device_index):
        if not dict(defines).get(BEFORE):
            return current(name, defines, device_index)
        key = (BEFORE, defines, device_index)
        if key not in runtime._MODULES:
            runtime._MODULES[key] = runtime.compile_source(runtime.inline_includes(text, "the older source"),
                                                           defines, device_index, "the older source")
        return runtime._MODULES[key]

    cuda_attention.compiled_module = compiled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the older kernels/sparse_attn_fwd.cu")
    ap.add_argument("--before-slots", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="kernel_before_after.json")
    args = ap.parse_args(argv)
    with open(args.before) as f:
        use_before_source(f.read())
    rows = []
    for H, H_kv, D, q, k, v, block_n, block_m, name, blocks in variant_cases(((32, 8, 128), (9, 3, 64)), args.tokens):
        scale = 1 / math.sqrt(D)
        fns = {"after": sift_fn(q, k, v, blocks, scale),  # the kernel's own choice of OVERLAP
               "after, overlap on": sift_fn(q, k, v, blocks, scale, extra={"OVERLAP": 1}),
               "after, overlap off": sift_fn(q, k, v, blocks, scale, extra={"OVERLAP": 0}),
               "before": sift_fn(q, k, v, blocks, scale, extra={BEFORE: 1, "TILE_SLOTS": args.before_slots})}
        outs = {n: fn().float() for n, fn in fns.items()}
        diff = max(float((o - outs["before"]).abs().max()) for o in outs.values())
        ms = interleaved_ms(fns, args.rounds)
        flops = computed_cells(blocks) * 4 * D
        row = dict(H=H, H_kv=H_kv, D=D, block_n=block_n, block_m=block_m, layout=name, ms=ms,
                   tflops={n: flops / t / 1e9 for n, t in ms.items()}, speedup=ms["before"] / ms["after"],
                   max_diff=diff)
        rows.append(row)
        print(f"{H}/{H_kv}/{D} KV {block_n} rows {block_m} {name:12s} before {ms['before']:.3f} "
              f"after {ms['after']:.3f} ms ({row['speedup']:.3f}x; overlap on "
              f"{ms['before'] / ms['after, overlap on']:.3f}x, off "
              f"{ms['before'] / ms['after, overlap off']:.3f}x) diff {diff:.1e}", flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
