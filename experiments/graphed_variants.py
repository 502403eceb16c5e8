"""SmolLM2's graphed prefill, full recompute against SIFT variants captured side by side on the same real prompts
(essays of about 4K and 8K tokens, NQ prompts of 20 passages): the kernel's tiles merged from runs of blocks (the
default) or a tile per block, query blocks per segment (the default) or on the grid (the backend's rows, or 128);
replays timed in turn (median), and SIFT's staging alone.

    python experiments/graphed_variants.py --data-dir DATA --out graphed_variants.json [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from sift_cli.attention.cuda import CudaBackend
from sift_cli.lab.bench.prefill_timing import timed
from sift_cli.lab.eval.prompt_sets import smollm2_real_prompts
from sift_cli.models import load_model
from sift_cli.prefill.graphs import GraphedPrefill, graphed_sparse_prefill
from sift_cli.prefill.options import PrefillOptions, for_prompt
from sift_cli.prefill.plan import choose_decoder

# (merged tiles, query blocks, query block rows; None: the backend's choice)
VARIANTS = {"sift": (True, "segment", None), "sift, tile per block": (False, "segment", None),
            "sift, grid query blocks": (True, "grid", None),
            "sift, grid query blocks of 128 rows": (True, "grid", 128)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="graphed_variants.json")
    ap.add_argument("--work", default="/tmp/smollm2-work")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    lm = load_model(None, device="cuda")
    decoder = choose_decoder(lm.device)
    rows = []
    for name, prompt in smollm2_real_prompts(lm, args.data_dir, args.work):
        ids = torch.tensor([prompt.input_ids], device=lm.device)
        graphs = {"full": GraphedPrefill(lm, ids)}
        for variant, (merge, query_blocks, block_m) in VARIANTS.items():
            backend = CudaBackend(merge=merge)
            opts = for_prompt(PrefillOptions(backend="cuda", query_blocks=query_blocks, block_m=block_m),
                              backend, lm.head_dim, prompt.bits)
            graphs[variant] = graphed_sparse_prefill(lm, prompt, backend, ids, opts, decoder, 5)
        logits = {k: g.replay()[0].float().clone() for k, g in graphs.items()}
        times = {k: [] for k in graphs}
        for _ in range(args.rounds):
            for k, g in graphs.items():
                times[k] += timed(g.replay, lm.device, 1, 0)
        row = {"prompt": name, "tokens": len(prompt.input_ids),
               "staging_ms": graphs["sift"].transfer_ms,
               **{f"{k} ms": statistics.median(v) for k, v in times.items()},
               **{f"{k} max |logit - sift|": float((logits[k] - logits["sift"]).abs().max())
                  for k in VARIANTS if k != "sift"}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del graphs, logits
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'prompt':16} {'tokens':>6} " + " ".join(f"{k:>36}" for k in ["full", *VARIANTS]))
    for r in rows:
        print(f"{r['prompt']:16} {r['tokens']:6d} " + " ".join(f"{r[f'{k} ms']:36.3f}" for k in ["full", *VARIANTS]))


if __name__ == "__main__":
    main()
