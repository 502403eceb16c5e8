"""Re-measure every published table on one GPU within a time budget; one result file per table's result
(`sift_cli/lab/report/published.py` names them), ready to copy into docs/results and render with `make
docs-tables`.

    SIFT_COMMIT=<hash> SIFT_DATA_DIR=<dir> PYTHONPATH=. python experiments/remeasure.py --out $OUT --budget 540

Phases, in this order, each with a share of the budget it does not pass (a phase out of time writes what it has,
the lengths it did not start as rows saying so): the 8B-shaped TTFT at 8K–64K graphed, then eager (with CacheBlend
and energy), the kernels (graph replays; Flex on the same blocks up to `--flex-max`), the decode, the bundled
SmolLM2's prefill, profiling throughput. Each file records the `sift` command that measures the same thing alone.
`--phases` and the length flags trim the run; the 8B-shaped 128K prompts fit in a call of their own:

    ... python experiments/remeasure.py --out $OUT --budget 540 --phases prefill-8b-graphed,prefill-8b-eager \
        --lengths 128k --repeat 3 --tag 128k

`--cpu-smoke` runs a tiny functional pass without a GPU (timings meaningless, files marked `cpu_smoke`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import traceback
from pathlib import Path

PHASES = ("prefill-8b-graphed", "prefill-8b-eager", "kernels", "prefill-smollm2", "profile")
SHARES = {"prefill-8b-graphed": 0.27, "prefill-8b-eager": 0.30, "kernels": 0.25, "prefill-smollm2": 0.08,
          "profile": 0.10}


def _lengths(text: str) -> list[int]:
    return [int(float(x.strip().lower().rstrip("k")) * (1024 if x.strip().lower().endswith("k") else 1))
            for x in text.split(",") if x.strip()]


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


TAG = ""  # --tag: appended to every file name (a second call's results beside the first's)


def write(out: Path, name: str, kind: str, rows: list, protocol, command: str, extra: dict | None = None) -> Path:
    from sift_cli.lab.results import make_result, write_result

    obj = make_result(kind, rows, protocol, {**(extra or {}), "driver": " ".join(sys.argv)}, argv=shlex.split(command))
    return write_result(out / f"{name}{TAG}.json", kind, obj)


def prefill_phase(out: Path, name: str, args, deadline: float, graphed: bool, models: str, lengths: list[int],
                  modes: tuple[str, ...], log) -> None:
    from sift_cli.lab.bench.prefill import bench_prefill

    energy = args.energy and not graphed or args.energy_graphed
    command = (f"sift bench prefill --models {models} --lengths {','.join(_k(n) for n in lengths)} --repeat "
               f"{args.repeat} --modes {','.join(modes)}" + (" --cuda-graphs" if graphed else "")
               + ("" if energy else " --no-energy") + f" --save docs/results/{name}{TAG}.json")
    got: list = []

    def checkpoint(new):
        got.extend(new)
        write(out, name, "bench-prefill", got, None, command, {"partial": True, "cpu_smoke": args.cpu_smoke})

    res = bench_prefill([models], lengths, modes=modes, repeat=args.repeat, warmup=1, energy=energy,
                        data=args.data_dir, cpu_smoke=args.cpu_smoke, log=log, cuda_graphs=graphed,
                        deadline=deadline, on_rows=checkpoint)
    write(out, name, "bench-prefill", res["rows"], res["protocol"], command,
          {"summary": res["summary"], "cpu_smoke": args.cpu_smoke})


def kernels_phase(out: Path, args, deadline: float, log) -> None:
    import torch

    from sift_cli.lab.bench import attention_kernels as kb
    from sift_cli.lab.bench.decode_kernel import bench_decode

    lengths = _lengths(args.kernel_lengths)
    command = f"sift bench kernels --lengths {','.join(_k(n) for n in lengths)} --timing graph " \
              "--save docs/results/kernels.json"
    config = {"configuration": {"shapes (H, H_kv, D)": [list(x) for x in kb.SHAPES], "densities": [1.0, 0.1],
                                "block_m": [128, 64], "block_n": [64],
                                "flex": f"document layouts, L <= {args.flex_max}"}}
    rows: list = []
    if not torch.cuda.is_available():
        rows.append({"kind": "attention", "error": "needs a CUDA GPU (Hopper)"})
    else:
        for L in lengths:
            if time.perf_counter() > deadline:
                rows.append({"kind": "attention", "L": L, "error": "skipped: time budget"})
                continue
            rows += kb.run_kernel_bench(lengths=(L,), densities=(1.0, 0.1), block_ns=(64,), block_ms=(128, 64),
                                        flex=L <= args.flex_max, flex_causal=False, decode=False, log=log,
                                        timings=("graph",))
            write(out, "kernels", "bench-kernels", rows, kb.protocol("graph"), command, {**config, "partial": True})
        if time.perf_counter() < deadline:
            rows += bench_decode(lengths=(15360, 32768, 65536), log=log, timings=("graph",))
    write(out, "kernels", "bench-kernels", rows, kb.protocol("graph"), command, config)


def profile_phase(out: Path, args, log) -> None:
    from sift_cli.lab.bench.profile import run_profile_bench

    cases = tuple(c for c in args.profile_cases.split(",") if c)
    command = f"sift bench profile --quick --cases {','.join(cases)} --save docs/results/profile.json"
    rows = run_profile_bench(data_dir=args.data_dir, device="cpu" if args.cpu_smoke else "cuda", quick=True,
                             cases=cases, log=log)
    write(out, "profile", "bench-profile", rows, "document tokens/s of the whole `sift profile` run against dense "
          "prefill of the same documents, one process, after a warm-up corpus", command)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the result files")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for everything (default 540)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    ap.add_argument("--lengths", default="8k,16k,32k,64k", help="8B-shaped prompt lengths (128k: a call of its own)")
    ap.add_argument("--smol-lengths", default="2k,4k,8k")
    ap.add_argument("--kernel-lengths", default="16k,32k,64k")
    ap.add_argument("--flex-max", type=int, default=32768, help="FlexAttention rows up to this length")
    ap.add_argument("--profile-cases", default="nq,essays,8b-2k")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-energy", dest="energy", action="store_false", help="no NVML energy in eager runs")
    ap.add_argument("--energy-graphed", action="store_true", help="energy in graphed runs too (≥ 1 s per mode)")
    ap.add_argument("--data-dir", type=Path, default=None, help="default: $SIFT_DATA_DIR")
    ap.add_argument("--cpu-smoke", action="store_true", help="without a GPU: a tiny functional pass")
    ap.add_argument("--tag", default="", help="appended to each file name: e.g. 128k for the longest prompts "
                                              "measured in a call of their own (prefill-8b-eager-128k.json)")
    args = ap.parse_args(argv)
    global TAG
    TAG = f"-{args.tag}" if args.tag else ""
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        ap.error(f"--phases: unknown {', '.join(sorted(unknown))}")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    end = start + args.budget
    status = {}

    def log(msg):
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    for phase in phases:
        now = time.perf_counter()
        if now >= end - 5:
            status[phase] = "skipped: budget spent"
            continue
        # a phase takes its share of what is left, so what earlier phases did not use passes on
        left = [p for p in phases if p not in status]
        deadline = now + (end - now) * SHARES[phase] / sum(SHARES[p] for p in left)
        log(f"phase {phase} (until +{deadline - start:.0f}s)")
        t0 = time.perf_counter()
        try:
            if phase == "prefill-8b-graphed":
                if args.cpu_smoke:
                    status[phase] = "skipped: CUDA graphs need a GPU"
                    continue
                prefill_phase(args.out, phase, args, deadline, True, "llama3-8b", _lengths(args.lengths),
                              ("full", "sift"), log)
            elif phase == "prefill-8b-eager":
                prefill_phase(args.out, phase, args, deadline, False, "llama3-8b", _lengths(args.lengths),
                              ("full", "sift", "cacheblend"), log)
            elif phase == "prefill-smollm2":
                prefill_phase(args.out, phase, args, deadline, not args.cpu_smoke, "smollm2",
                              _lengths(args.smol_lengths), ("full", "sift"), log)
            elif phase == "kernels":
                kernels_phase(args.out, args, deadline, log)
            elif phase == "profile":
                profile_phase(args.out, args, log)
            status[phase] = f"done in {time.perf_counter() - t0:.0f}s"
        except Exception as exc:  # one phase failing must not lose the others
            status[phase] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
            traceback.print_exc()
    (args.out / f"remeasure-status{TAG}.json").write_text(json.dumps({"phases": status, "seconds":
                                                                time.perf_counter() - start}, indent=1))
    for phase, s in status.items():
        print(f"{phase:<20} {s}")
    return 0 if all(s.startswith(("done", "skipped")) for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
