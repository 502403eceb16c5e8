"""`sift bench prefill` in phases on one H200: the Llama-3-8B-shaped model (random bf16 weights, published config) at
8K/16K/32K/64K with tile patterns drawn at the paper's densities (LA 27.3%, CA 5.8%) — full recompute with SDPA
pinned to cuDNN, SIFT (cuda backend if it imports, else flex), CacheBlend (KV streamed from pinned host memory;
SSD read modelled) — with NVML energy; then SmolLM2 at 8K with real profiles; then, as time allows, SIFT with
FlexAttention on the 8B-shaped model and the 8B-shaped model with patterns sampled from SmolLM2 profiles.

    python experiments/prefill_phases.py --gguf PATH --data DIR --out $OUT/prefill-phases.json

--gguf: the SmolLM2 checkpoint: a .gguf file (needs the `gguf` package) or the dequantised safetensors directory
sift caches (~/.cache/sift/gguf/<sha>/). --data: the folder with paul-graham-essays/. Each case runs under its
own try/except; the JSON is rewritten after every case, so a timeout keeps what finished; a compact table is
printed last. Budget: --budget seconds (default 225) of wall time, checked between cases.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from sift_cli.lab.bench import prefill as bp

T0 = time.perf_counter()


def log(msg):
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "prefill-phases.json"))
    ap.add_argument("--budget", type=float, default=225.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--aligned-only", default=None, help="comma-separated lengths: only full vs SIFT on the 8B-shaped "
                    "model at the paper's densities with a 64-token prefix (documents on the KV block grid)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU: checks the script, times nothing")
    args = ap.parse_args()
    deadline = T0 + args.budget



    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": [], "notes": [], "env": {}}

    def save():
        result["elapsed_s"] = time.perf_counter() - T0
        result["summary"] = bp.summarize_rows(result["rows"])
        out_path.write_text(json.dumps(result, indent=1, default=str))

    def note(msg):
        log(msg)
        result["notes"].append(msg)

    smoke = args.cpu_smoke
    if not torch.cuda.is_available() and not smoke:
        note("no CUDA GPU: nothing to do (--cpu-smoke checks the script on CPU)")
        save()
        return 1
    dev = torch.device("cpu" if smoke else "cuda")
    result["env"] = {"gpu": "CPU smoke run" if smoke else torch.cuda.get_device_name(dev), "torch": torch.__version__,
                     "capability": None if smoke else list(torch.cuda.get_device_capability(dev))}
    try:
        import transformers

        result["env"]["transformers"] = transformers.__version__
    except Exception:
        pass
    try:
        import subprocess

        result["env"]["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                 text=True, timeout=5).stdout.strip()
    except Exception:
        pass
    try:
        from sift_cli.attention.cuda import CudaBackend

        ok, why = CudaBackend.available(dev)
    except Exception as exc:
        ok, why = False, f"{type(exc).__name__}: {exc}"
    backends = ("cuda",) if ok else (("reference",) if smoke else ("flex",))
    note(f"SIFT backend for the main runs: {backends[0]}" + ("" if ok else f" (cuda unavailable: {why})"))
    try:
        import pynvml  # noqa: F401
    except Exception:
        note("pynvml missing: no energy")

    def emit(rows):
        result["rows"].extend(rows)
        save()

    def run(case, modes, bks, energy=True, repeat=args.repeat, baseline=None, host_kv=None):
        if time.perf_counter() > deadline:
            emit([{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids), "mode": "all",
                   "error": "skipped: time budget"}])
            return []
        try:
            rows = bp.run_case(case, modes, bks, repeat, 1, energy, host_kv=host_kv, log=log, baseline=baseline)
        except Exception as exc:
            rows = [{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids), "mode": "all",
                     "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}]
            log(traceback.format_exc(limit=3))
        emit(rows)
        if not smoke:
            torch.cuda.empty_cache()
        return rows

    lengths = (256, 384) if smoke else (8192, 16384, 32768, 65536)
    big = lengths[-1]
    doc_tokens = 96 if smoke else 2048
    device = "cpu" if smoke else "cuda"
    overrides = bp.CPU_SMOKE_LLAMA if smoke else None
    baselines: dict[int, tuple[float, float]] = {}

    if args.aligned_only:
        lens = [int(x) for x in args.aligned_only.split(",")]
        lm_a = None
        for prefix_len in (64, 16):
            for case in bp.llama_cases(lens, "paper", 96 if smoke else 2048, 64, None, device, overrides,
                                       lm=lm_a, prefix_len=prefix_len):
                lm_a = case.lm
                run(case, ("full", "sift"), backends, energy=False)
        save()
        print_table(result)
        return 0

    # ---- phase 1: 8B-shaped, paper densities: full (cuDNN) / no-attention / SIFT / CacheBlend, energy ----------
    lm8 = None
    host_kv = None
    try:
        log("building the Llama-3-8B-shaped model")
        cases = list(bp.llama_cases(lengths, "paper", doc_tokens, 64, None, device, overrides))
        lm8 = cases[0].lm
        log(f"model ready: {torch.cuda.memory_allocated() / 2**30:.1f} GiB" if not smoke else "model ready")
        cfg = lm8.model.config
        try:
            host_kv = bp.HostKV(cfg.num_hidden_layers, max(lengths), cfg.num_key_value_heads, cfg.head_dim,
                                lm8.dtype, pin=not smoke)
            log("pinned host KV ready")
        except Exception as exc:
            note(f"no pinned host KV ({exc}); CacheBlend skipped")
        for case in cases:
            modes = ("full", "sift") + (("cacheblend",) if host_kv is not None else ())
            rows = run(case, modes, backends, host_kv=host_kv)
            full = [r for r in rows if r.get("mode") == "full" and "ttft_ms" in r]
            rest = [r for r in rows if r.get("mode") == "no-attention" and "ttft_ms" in r]
            if full and rest:
                baselines[len(case.input_ids)] = (full[0]["ttft_ms"], rest[0]["ttft_ms"])
    except Exception as exc:
        note(f"phase 1 failed: {type(exc).__name__}: {exc}")
        log(traceback.format_exc(limit=4))
    del host_kv
    gc.collect()
    if not smoke:
        torch.cuda.empty_cache()

    # ---- phase 2: SmolLM2 at 8K with real profiles ------------------------------------------------------------
    smol = None
    if args.gguf:
        try:
            from sift_cli.models import load_model

            smol = load_model(None if args.gguf == "bundled" else args.gguf, device=device)
            log(f"SmolLM2 loaded from {args.gguf}")
            extra = () if smoke else ("flex",)
            for case in bp.smol_cases(smol, [512 if smoke else 8192], args.data, doc_tokens):
                run(case, ("full", "sift", "cacheblend"), tuple(dict.fromkeys(backends + extra)))
        except Exception as exc:
            note(f"SmolLM2 phase failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            log(traceback.format_exc(limit=4))
    else:
        note("no --gguf: SmolLM2 skipped")

    # ---- phase 3: 8B-shaped with patterns sampled from SmolLM2 profiles, 64K, main backend ----------------------
    if smol is not None and lm8 is not None and time.perf_counter() < deadline - 30:
        try:
            sources = bp.real_profiles(smol, bp.essay_token_docs(smol, args.data, doc_tokens, 16))[1]
            for case in bp.llama_cases([big], "sampled", doc_tokens, 64, sources, device, lm=lm8):
                run(case, ("sift",), backends, energy=False, repeat=2, baseline=baselines.get(big))
                break
        except Exception as exc:
            note(f"sampled-pattern phase failed: {type(exc).__name__}: {exc}")
            log(traceback.format_exc(limit=4))
    del smol
    gc.collect()
    if not smoke:
        torch.cuda.empty_cache()

    # ---- phase 4: 8B-shaped, paper densities, SIFT through FlexAttention (compiles per length) ------------------
    if lm8 is not None and backends[0] == "cuda":
        for case in bp.llama_cases((16384, 32768, 8192), "paper", doc_tokens, 64, None, device, lm=lm8):
            if time.perf_counter() > deadline - 20:
                note("flex on the 8B-shaped model: out of time")
                break
            run(case, ("sift",), ("flex",), energy=False, repeat=2, baseline=baselines.get(len(case.input_ids)))

    save()
    print_table(result)
    return 0


def print_table(result):
    print("\n== bench prefill on", result["env"].get("gpu"), "==")
    hdr = f"{'model':<26} {'bits':<30} {'L':>6} {'mode':<13} {'TTFT ms':>9} {'attn ms':>8} {'dens':>6} " \
          f"{'×full':>6} {'/ideal':>7} {'J':>7} {'tok/J':>7} {'ED2P':>8}"
    print(hdr)
    for r in result["rows"]:
        if "error" in r:
            print(f"{r.get('model', '')[:26]:<26} {r.get('pattern', '')[:30]:<30} {r.get('tokens', 0):>6} "
                  f"{r.get('mode', ''):<13} ERROR {r['error'][:70]}")
            continue

        def f(k, nd=1):
            v = r.get(k)
            return "-" if v is None else f"{v:.{nd}f}"

        print(f"{r['model'][:26]:<26} {r['pattern'][:30]:<30} {r['tokens']:>6} {r['mode']:<13} {f('ttft_ms'):>9} "
              f"{f('attention_ms'):>8} {f('cell_density', 3):>6} {f('speedup', 2):>6} {f('ttft_over_ideal', 3):>7} "
              f"{f('energy_j', 2):>7} {f('tokens_per_j', 0):>7} {f('ed2p', 3):>8}")
    for n in result["notes"]:
        print("note:", n)
    print(f"elapsed {result.get('elapsed_s', 0):.0f} s")


if __name__ == "__main__":
    sys.exit(main())
