"""Where the host time of an eager sparse prefill goes, beside full recompute's, on the bundled SmolLM2 (a model
small enough that its eager forward is bound by the host: the time to first token is the time Python takes to
enqueue it). Real prompts (an essay prompt of ~4K tokens, an NQ prompt of 20 passages); every phase of SIFT's
time to first token timed alone (the device idle before each, medians), one attention call of each kind timed
alone on a layer's real q/k/v, and the CUDA kernels each forward launches counted (torch.profiler, after every
prompt is timed: once the profiler has run in a process, each launch costs more host time).

    python experiments/prefill_host_time.py --data-dir DATA --out host_time.json [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sift_cli.attention.backends import get_backend
from sift_cli.attention.integration import sift_attention_forward, sparse_attention
from sift_cli.config import resolve_profile_config
from sift_cli.cuda.runtime import sm_count
from sift_cli.cuda.work_order import SPLIT_MAX, work_order
from sift_cli.lab.bench.prefill_timing import NOATTN, stand_in
from sift_cli.lab.eval.prompt_sets import compose, ensure_shards, essay_prompt_set, nq_prompt_set
from sift_cli.models import load_model
from sift_cli.prefill.options import PrefillOptions, for_prompt
from sift_cli.prefill.plan import decode_all_layers, prepare_sparse, prompt_tensors
from sift_cli.prefill.run import dense_prefill, run_forward, sparse_prefill, strongest_sdpa, sync_device


def phase(fn, dev, repeat: int) -> dict:
    """fn() timed `repeat` times from an idle device: host (until it returns) and wall (until the device is done)."""
    host, wall = [], []
    for _ in range(repeat):
        sync_device(dev)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync_device(dev)
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return {"host_ms": statistics.median(host), "wall_ms": statistics.median(wall)}


def per_call_us(fn, dev, n: int = 200) -> float:
    """Host microseconds per call of fn, enqueued back to back (the device's queue absorbs them)."""
    fn()
    sync_device(dev)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) * 1e6 / n
    sync_device(dev)
    return us


@torch.inference_mode()
def kernels_launched(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if str(e.device_type).endswith("CUDA"))


def layer_qkv(lm, ids):
    """Layer 0's q, k, v as the attention function receives them ([1, H, L, D], [1, H_kv, L, D])."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    got = {}

    def grab(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        if module.layer_idx == 0:
            got["qkv"] = (module, query.clone(), key.clone(), value.clone(), scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kw)

    from sift_cli.attention.swap import swapped_attention

    with torch.inference_mode(), swapped_attention(lm.model, "sift_host_time_grab", grab):
        lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    return got["qkv"]


@torch.inference_mode()
def measure(lm, prompt, repeat: int) -> tuple[dict, dict]:
    """The prompt's timings, and the calls whose kernels the caller counts (name → fn)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dev = lm.device
    ids = torch.tensor([prompt.input_ids], device=dev)
    backend = get_backend("cuda", dev)
    opts = for_prompt(PrefillOptions(backend="cuda"), backend, lm.head_dim, prompt.bits)
    bits, table = prompt_tensors(prompt, opts, dev)
    plan_box: dict = {}

    def prepare():
        plan_box["plan"] = prepare_sparse(lm, bits, table, backend, "cuda")

    def sparse_forward():
        return run_forward(lm, ids, sparse_attention(lm.model, plan_box["plan"]))

    def sift_ttft():
        b, t = prompt_tensors(prompt, opts, dev)
        plan = prepare_sparse(lm, b, t, backend, "cuda")
        return run_forward(lm, ids, sparse_attention(lm.model, plan))

    dense = lambda: run_forward(lm, ids, strongest_sdpa(dev))  # noqa: E731
    for _ in range(3):
        dense()
        prepare()
        sparse_forward()
    out = {"tokens": len(prompt.input_ids)}
    out["dense_forward"] = phase(dense, dev, repeat)
    with stand_in(lm.model, NOATTN):
        out["no_attention_forward"] = phase(lambda: lm.model(input_ids=ids, use_cache=True, logits_to_keep=1), dev,
                                            repeat)
    out["sift_ttft"] = phase(sift_ttft, dev, repeat)
    out["transfer"] = phase(lambda: prompt_tensors(prompt, opts, dev), dev, repeat)
    parts = []

    def one_prefill():
        r = sparse_prefill(lm, prompt, backend, ids, opts, "cuda")
        parts.append((r.ttft_ms, r.transfer_ms, r.prepare_ms, r.forward_ms))

    out["sparse_prefill"] = phase(one_prefill, dev, repeat)
    out["sparse_prefill_parts_ms"] = dict(zip(("ttft_ms", "transfer_ms", "prepare_ms", "forward_ms"),
                                              (statistics.median(p) for p in zip(*parts))))
    dense_ms, sift_ms = [], []  # as run_prefill does: dense and SIFT alternating, the last of each kept
    d = r = None
    for _ in range(15):
        d = None
        d = dense_prefill(lm, ids)
        r = None
        r = sparse_prefill(lm, prompt, backend, ids, opts, "cuda")
        dense_ms.append(d.timing.wall_ms)
        sift_ms.append(r.ttft_ms)
    del d, r
    out["interleaved_ms"] = {"dense": statistics.median(dense_ms), "sift": statistics.median(sift_ms),
                             "sift_over_dense": statistics.median(s / d for s, d in zip(sift_ms, dense_ms)),
                             "sift_runs": [round(x, 2) for x in sift_ms], "dense_runs": [round(x, 2) for x in dense_ms]}
    spec = backend.work_spec(table, dev, lm.head_dim)
    out["decode"] = phase(lambda: decode_all_layers(bits, table, lm.n_layers, "cuda", spec), dev, repeat)
    out["decode_without_tiles"] = phase(lambda: decode_all_layers(bits, table, lm.n_layers, "cuda"), dev, repeat)
    _, stacked = decode_all_layers(bits, table, lm.n_layers, "cuda")
    out["work_order"] = phase(lambda: work_order(stacked[0], 2, sm_count(dev), SPLIT_MAX), dev, repeat)
    out["prepare"] = phase(prepare, dev, repeat)

    out["sparse_forward_reused_plan"] = phase(sparse_forward, dev, repeat)
    first = []
    for _ in range(repeat):
        prepare()
        sync_device(dev)
        t0 = time.perf_counter()
        sparse_forward()
        first.append((time.perf_counter() - t0) * 1e3)
        sync_device(dev)
    out["sparse_forward_fresh_plan_host_ms"] = statistics.median(first)
    module, q, k, v, scaling = layer_qkv(lm, ids)
    plan = plan_box["plan"]
    with strongest_sdpa(dev):
        out["sdpa_call_us"] = per_call_us(lambda: sdpa_attention_forward(module, q, k, v, None, scaling=scaling), dev)
    from sift_cli.attention import integration

    integration._local.plan = plan
    try:
        out["sift_call_us"] = per_call_us(lambda: sift_attention_forward(module, q, k, v, None, scaling=scaling), dev)
        out["plan_attend_us"] = per_call_us(lambda: plan.attend(0, q[0], k[0], v[0], scaling), dev)
    finally:
        integration._local.plan = None

    def swap():
        with sparse_attention(lm.model, plan):
            pass
    out["swap_us"] = per_call_us(swap, dev, 50)
    # counted by the caller once every prompt is timed: after torch.profiler has run, launches cost more host time
    counters = {"kernels_dense": dense, "kernels_sift_forward": sparse_forward, "kernels_sift_prepare": prepare,
                "kernels_transfer": lambda: prompt_tensors(prompt, opts, dev)}
    return out, counters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="host_time.json")
    ap.add_argument("--work", default="/tmp/smollm2-work")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    lm = load_model(None, device="cuda")
    cfg = resolve_profile_config(lm.device, {}).profile
    rows, counters = [], []
    for name, pset in (("essays 4K", essay_prompt_set(args.data_dir, 1, 2, 1450)),
                       ("NQ 20 passages", nq_prompt_set(args.data_dir, 20, 1))):
        shards = ensure_shards(pset, lm, cfg, f"{args.work}/{name.replace(' ', '_')}")
        out, count = measure(lm, compose(shards, lm, pset.prompts[0]), args.repeat)
        rows.append({"prompt": name, **out})
        counters.append(count)
    for row, count in zip(rows, counters):
        row.update({k: kernels_launched(fn) for k, fn in count.items()})
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    for r in rows:
        print(f"{r['prompt']} ({r['tokens']} tokens), host ms / wall ms:")
        for key in ("dense_forward", "no_attention_forward", "sift_ttft", "sparse_prefill", "transfer", "decode",
                    "decode_without_tiles", "work_order", "prepare", "sparse_forward_reused_plan"):
            print(f"  {key:<28}{r[key]['host_ms']:>8.3f}{r[key]['wall_ms']:>8.3f}")
        print(f"  sparse_prefill parts: {r['sparse_prefill_parts_ms']}")
        print(f"  interleaved: {r['interleaved_ms']}")
        print(f"  sparse forward, fresh plan: host {r['sparse_forward_fresh_plan_host_ms']:.3f} ms; per call: SDPA "
              f"{r['sdpa_call_us']:.1f} us, sift {r['sift_call_us']:.1f} us (plan.attend {r['plan_attend_us']:.1f}), "
              f"swap {r['swap_us']:.1f} us; kernels: dense {r['kernels_dense']}, sift forward "
              f"{r['kernels_sift_forward']} + prepare {r['kernels_sift_prepare']} + transfer {r['kernels_transfer']}")


if __name__ == "__main__":
    main()
