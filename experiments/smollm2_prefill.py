"""SmolLM2 sparse prefill on real prompts: essays of about 4K and 8K tokens and NQ prompts of 20 passages, dense
against SIFT (cuda backend), eager and with CUDA graphs, beside the ideal for the density (dense minus the
skipped share of dense attention, attention measured as dense minus a forward without attention).

    python experiments/smollm2_prefill.py --data-dir DATA --out smollm2.json [--repeat 5] [--block-m 128,64]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch

from sift_cli.attention.backends import get_backend
from sift_cli.config import resolve_profile_config
from sift_cli.lab.bench.prefill_timing import NOATTN, stand_in, timed
from sift_cli.lab.eval.prompt_sets import compose, ensure_shards, smollm2_real_prompt_sets
from sift_cli.models import load_model
from sift_cli.prefill.graphs import GraphedPrefill
from sift_cli.prefill.options import PrefillOptions
from sift_cli.prefill.plan import choose_decoder
from sift_cli.prefill.report import run_prefill
from sift_cli.prefill.run import dense_prefill, sparse_prefill


def no_attention_ms(lm, ids, graphs: bool, repeat: int) -> float:
    """The forward with attention replaced by a free stand-in: everything but attention."""
    with torch.inference_mode(), stand_in(lm.model, NOATTN):
        if graphs:
            g = GraphedPrefill(lm, ids)
            return statistics.median(timed(g.replay, lm.device, repeat, 2))
        return statistics.median(timed(lambda: lm.model(input_ids=ids, use_cache=True, logits_to_keep=1),
                                       lm.device, repeat, 2))


def host_profile(lm, prompt, backend_name: str) -> str:
    """cProfile of one eager SIFT prefill and one dense prefill (after warm-up): where the host time goes."""
    ids = torch.tensor([prompt.input_ids], device=lm.device)
    backend, decoder = get_backend(backend_name, lm.device), choose_decoder(lm.device)
    opts = PrefillOptions(backend=backend_name)
    for _ in range(3):
        sparse_prefill(lm, prompt, backend, ids, opts, decoder)
        dense_prefill(lm, ids)
    text = io.StringIO()
    for name, fn in (("sift", lambda: sparse_prefill(lm, prompt, backend, ids, opts, decoder)),
                     ("dense", lambda: dense_prefill(lm, ids))):
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        text.write(f"==== {name}\n")
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="smollm2_prefill.json")
    ap.add_argument("--work", default="/tmp/smollm2-work")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--nq-prompts", type=int, default=2)
    ap.add_argument("--block-m", default="auto", help="query block rows: auto (the backend's choice) or sizes, "
                                                      "comma-separated (one SIFT run per size)")
    ap.add_argument("--host-profile", default=None, help="write a cProfile of one eager prefill of each mode here")
    args = ap.parse_args()
    lm = load_model(None, device="cuda")
    cfg = resolve_profile_config(lm.device, {}).profile
    sets = smollm2_real_prompt_sets(args.data_dir, args.nq_prompts)
    rows = []
    for name, pset in sets:
        t0 = time.perf_counter()
        shards = ensure_shards(pset, lm, cfg, f"{args.work}/{name.replace(' ', '_')}")
        for spec in pset.prompts:
            prompt = compose(shards, lm, spec)
            ids = torch.tensor([prompt.input_ids], device=lm.device)
            if args.host_profile and name == "essays 4K":
                with open(args.host_profile, "w") as f:
                    f.write(host_profile(lm, prompt, args.backend))
            for graphs, block_m in ((g, None if m == "auto" else int(m)) for g in (False, True)
                                  for m in args.block_m.split(",")):
                r = run_prefill(lm, prompt, PrefillOptions(backend=args.backend, repeat=args.repeat, warmup=2,
                                                           cuda_graphs=graphs, max_new_tokens=8, block_m=block_m))
                rest = no_attention_ms(lm, ids, graphs, args.repeat)
                dense, sift, cells = r["dense"]["ttft_ms"], r["sift"]["ttft_ms"], r["density"]["cells"]
                ideal = dense - (1 - cells) * max(0.0, dense - rest)
                row = {"prompt": name, "tokens": r["prompt_tokens"]["total"], "cuda_graphs": graphs,
                       "block_m": r["block_m"], "query_blocks": r["query_blocks"],
                       "dense_ms": dense, "sift_ms": sift, "sift_over_dense": sift / dense,
                       "no_attention_ms": rest, "ideal_ms": ideal, "sift_over_ideal": sift / ideal,
                       "dense_host_ms": r["dense"]["host_ms"], "dense_gpu_ms": r["dense"]["gpu_ms"],
                       "sift_host_ms": r["sift"]["host_ms"], "sift_gpu_ms": r["sift"]["gpu_ms"],
                       "cell_density": cells, "block_density": r["density"]["blocks"],
                       "cells_over_allowed": r["density"]["cells_over_allowed"],
                       "first_token_match": r["first_token_match"], "kl": r["kl"],
                       "graph_logits_equal_eager": r.get("graph_logits_equal_eager"),
                       "capture_ms": r.get("capture_ms")}
                rows.append(row)
                print(json.dumps(row), flush=True)
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'prompt':<16}{'tokens':>7}{'graphs':>7}{'rows':>5}{'cut':>8}{'dense':>8}{'SIFT':>8}{'ideal':>8}{'S/D':>6}"
          f"{'S/ideal':>8}"
          f"{'density':>8}{'c/a':>7}")
    for r in rows:
        print(f"{r['prompt']:<16}{r['tokens']:>7}{str(r['cuda_graphs']):>7}{r['block_m']:>5}{r['query_blocks']:>8}"
              f"{r['dense_ms']:>8.2f}"
              f"{r['sift_ms']:>8.2f}"
              f"{r['ideal_ms']:>8.2f}{r['sift_over_dense']:>6.2f}{r['sift_over_ideal']:>8.3f}"
              f"{r['cell_density']:>8.3f}{r['cells_over_allowed']:>7.3f}")


if __name__ == "__main__":
    main()
