"""Where a graphed prefill's time goes on SmolLM2's real prompts (essays of ~4K and ~8K tokens, NQ prompts of 20
passages): full recompute and SIFT as `sift prefill --cuda-graphs` runs them (each replay restages the prompt's
ids, and SIFT's bits, in the pinned buffer its graph copies from), beside both with the ids left on the device as
they were captured (only SIFT restaging, its bits: the protocol before 2026-12-02), and SIFT with segment query
blocks. Each replay is timed in one interleaved loop: host wall clock, CUDA events around the graph, the host time of
the staging (and of a second staging straight after it) and of the launch call. All prompts are timed before
torch.profiler first runs in the process, then again after it (`after_profiler`): once the profiler has run, graph
launches cost more host time. Last, the GPU time of every kernel per replay (torch.profiler) shows which kernels the
modes differ in.

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
from sift_cli.prefill.graphs import GraphedPrefill, graphed_sparse_prefill
from sift_cli.prefill.options import PrefillOptions, for_prompt
from sift_cli.prefill.plan import choose_decoder

MODES = {  # mode: (SIFT's query blocks or None for full recompute, the ids restaged each replay)
    "full": (None, True),
    "sift": ("auto", True),
    "full, ids fixed": (None, False),
    "sift, ids fixed": ("auto", False),
    "sift, segment": ("segment", True),
}


def timed_replays(graphs: dict, rounds: int) -> dict:
    """Per mode, medians over `rounds` interleaved replays (the first dropped): wall, events, stage, restage (a
    second staging straight after the first), launch (ms)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    got = {k: [] for k in graphs}
    for i in range(rounds + 1):
        for k, g in graphs.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g.stage()
            t1 = time.perf_counter()
            g.stage()
            t1b = time.perf_counter()
            e0.record()
            g.graph.replay()
            t2 = time.perf_counter()
            e1.record()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            if i:
                got[k].append(((t3 - t0 - (t1b - t1)) * 1e3, e0.elapsed_time(e1), (t1 - t0) * 1e3,
                               (t1b - t1) * 1e3, (t2 - t1b) * 1e3))
    names = ("wall_ms", "events_ms", "stage_ms", "restage_ms", "launch_ms")
    return {k: dict(zip(names, (statistics.median(x[j] for x in v) for j in range(len(names)))))
            for k, v in got.items()}


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


def capture(lm, prompt, cut, stage_ids: bool, decoder):
    ids = torch.tensor([prompt.input_ids], device=lm.device)
    if cut is None:
        return GraphedPrefill(lm, ids, repeat=5, stage_ids=stage_ids), None
    backend = CudaBackend()
    opts = for_prompt(PrefillOptions(backend="cuda", query_blocks=cut), backend, lm.head_dim, prompt.bits)
    return graphed_sparse_prefill(lm, prompt, backend, ids, opts, decoder, 5, stage_ids), opts.query_blocks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="graphed_breakdown.json")
    ap.add_argument("--work", default="/tmp/smollm2-work")
    ap.add_argument("--rounds", type=int, default=31)
    args = ap.parse_args()
    lm = load_model(None, device="cuda")
    decoder = choose_decoder(lm.device)
    rows, all_graphs = [], []
    for name, prompt in smollm2_real_prompts(lm, args.data_dir, args.work):
        graphs, cuts = {}, {}
        for mode, (cut, stage_ids) in MODES.items():
            graphs[mode], cuts[mode] = capture(lm, prompt, cut, stage_ids, decoder)
        rows.append({"prompt": name, "tokens": len(prompt.input_ids), "selected_share": prompt.bits.selected_share(),
                     "query_blocks": cuts})
        all_graphs.append(graphs)
    for row, graphs in zip(rows, all_graphs):
        row["timings"] = timed_replays(graphs, args.rounds)
        row["transfer_ms"] = {k: g.transfer_ms for k, g in graphs.items()}
    for row, graphs in zip(rows, all_graphs):
        row["kernels_ms"] = {k: kernel_times(g) for k, g in graphs.items()}
    for row, graphs in zip(rows, all_graphs):
        row["timings_after_profiler"] = timed_replays(graphs, args.rounds)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels_ms"}), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    for when in ("timings", "timings_after_profiler"):
        print(f"\n{when}")
        print(f"{'prompt':16} {'tokens':>6} {'mode':16} {'cut':>8} {'wall':>8} {'events':>8} {'stage':>7} {'again':>7} "
              f"{'launch':>7} {'kernels':>8} {'attention':>9} {'decode':>7}")
        for r in rows:
            for m, t in r[when].items():
                k = r["kernels_ms"][m]
                attention = sum(v for n, v in k.items() if "sdpa" in n or "sift_sparse_attn" in n)
                decode = sum(v for n, v in k.items() if "sift_decode" in n or "sift_coalesce" in n)
                print(f"{r['prompt']:16} {r['tokens']:6d} {m:16} {r['query_blocks'][m] or '-':>8} "
                      f"{t['wall_ms']:8.3f} {t['events_ms']:8.3f} {t['stage_ms']:7.3f} {t['restage_ms']:7.3f} "
                      f"{t['launch_ms']:7.3f} {sum(k.values()):8.3f} {attention:9.3f} {decode:7.3f}")


if __name__ == "__main__":
    main()
