"""Where a graphed prefill's time goes on SmolLM2's real prompts (essays of ~4K and ~8K tokens, NQ prompts of 20
passages): full recompute, SIFT with segment query blocks and SIFT as `sift prefill` runs it (`--query-blocks auto`),
captured side by side. Each replay is timed three ways in one interleaved loop: host wall clock, CUDA events around
the graph, and the host time of SIFT's staging and of the launch call alone; then the GPU time of every kernel
(torch.profiler, per replay) shows which kernels the modes differ in.

    python experiments/graphed_breakdown.py --data-dir DATA --out graphed_breakdown.json [--rounds 31]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from sift_cli.attention.cuda import CudaBackend
from sift_cli.lab.eval.prompt_sets import smollm2_real_prompts
from sift_cli.models import load_model
from sift_cli.prefill import PrefillOptions, choose_decoder, for_prompt
from sift_cli.prefill_graphs import GraphedPrefill, graphed_sparse_prefill


def timed_replays(graphs: dict, rounds: int) -> dict:
    """Per mode, medians over `rounds` interleaved replays (the first dropped): wall, events, stage, launch (ms)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    got = {k: [] for k in graphs}
    for i in range(rounds + 1):
        for k, g in graphs.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if g.before_replay is not None:
                g.before_replay()
            t1 = time.perf_counter()
            e0.record()
            g.graph.replay()
            t2 = time.perf_counter()
            e1.record()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            if i:
                got[k].append(((t3 - t0) * 1e3, e0.elapsed_time(e1), (t1 - t0) * 1e3, (t2 - t1) * 1e3))
    return {k: dict(zip(("wall_ms", "events_ms", "stage_ms", "launch_ms"),
                        (statistics.median(x[j] for x in v) for j in range(4)))) for k, v in got.items()}


def kernel_times(graph: GraphedPrefill, replays: int = 5) -> dict[str, float]:
    """GPU ms per replay of each kernel (by name, summed over its launches)."""
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        if e.device_time_total > 0:
            out[e.key[:80]] += e.device_time_total / replays / 1e3
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="graphed_breakdown.json")
    ap.add_argument("--work", default="/tmp/smollm2-work")
    ap.add_argument("--rounds", type=int, default=31)
    args = ap.parse_args()
    lm = load_model(None, device="cuda")
    decoder = choose_decoder(lm.device)
    rows = []
    for name, prompt in smollm2_real_prompts(lm, args.data_dir, args.work):
        ids = torch.tensor([prompt.input_ids], device=lm.device)
        backend = CudaBackend()
        graphs = {"full": GraphedPrefill(lm, ids)}
        cuts = {}
        for mode, cut in (("sift, segment", "segment"), ("sift", "auto")):
            opts = for_prompt(PrefillOptions(backend="cuda", query_blocks=cut), backend, lm.head_dim, prompt.bits)
            cuts[mode] = opts.query_blocks
            graphs[mode] = graphed_sparse_prefill(lm, prompt, backend, ids, opts, decoder, 5)
        row = {"prompt": name, "tokens": len(prompt.input_ids), "selected_share": prompt.bits.selected_share(),
               "query_blocks": cuts, "timings": timed_replays(graphs, args.rounds),
               "kernels_ms": {k: kernel_times(g) for k, g in graphs.items()}}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels_ms"}), flush=True)
        del graphs
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    modes = list(rows[0]["timings"])
    print(f"{'prompt':16} {'tokens':>6} {'mode':14} {'cut':>8} {'wall':>8} {'events':>8} {'stage':>7} {'launch':>7} "
          f"{'kernels':>8} {'attention':>9} {'decode':>7}")
    for r in rows:
        for m in modes:
            t, k = r["timings"][m], r["kernels_ms"][m]
            attention = sum(v for n, v in k.items() if "sdpa" in n or "sift_sparse_attn" in n)
            decode = sum(v for n, v in k.items() if "sift_decode" in n or "sift_coalesce" in n)
            print(f"{r['prompt']:16} {r['tokens']:6d} {m:14} {r['query_blocks'].get(m, '-'):>8} {t['wall_ms']:8.3f} "
                  f"{t['events_ms']:8.3f} {t['stage_ms']:7.3f} {t['launch_ms']:7.3f} {sum(k.values()):8.3f} "
                  f"{attention:9.3f} {decode:7.3f}")


if __name__ == "__main__":
    main()
