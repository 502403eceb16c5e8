"""GPU time of a kernel call: CUDA events around eager calls (`time_ms`) or around CUDA-graph replays, which leave
out host launch overhead (`graph_time_ms`)."""

from __future__ import annotations

import numpy as np
import torch


def time_ms(fn, warmup: int = 3, reps: int = 10, budget_ms: float = 4000.0) -> float:
    """Median time of fn() in ms from CUDA events; warm-up first; fewer reps when one call is long."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    one = start.elapsed_time(end)
    reps = max(3, min(reps, int(budget_ms / max(one, 1e-3))))
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in times]))


def graph_time_ms(fn, reps: int = 50, calls: int = 1) -> float | None:
    """GPU time of one fn() from replays of a CUDA graph of `calls` calls (no host launch overhead; several calls
    amortise the graph's own launch for short kernels); None if capture fails."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        g.replay()
        torch.cuda.synchronize()
        return time_ms(g.replay, warmup=3, reps=reps) / calls
    except Exception:
        return None


def graph_time_us(fn, reps: int = 30, calls: int = 20) -> float:
    """`graph_time_ms` in µs, raising where the capture fails (for comparisons that must not lose a row)."""
    ms = graph_time_ms(fn, reps=reps, calls=calls)
    if ms is None:
        raise RuntimeError("CUDA-graph capture failed")
    return 1e3 * ms
