"""Two GPUs against one: `sift profile CORPUS --gpus 1` and `--gpus 2` on the same corpus of at least 5×10⁷ tokens
with the bundled SmolLM2; the shards' bit columns compared per doc_id byte for byte, `sift validate` on both, and a
table of tokens, documents, time, start-up, throughput and speed-up (documents per second, start-up included).

The corpus is the essays (cut to --essay-words) and the NQ gold passages, repeated under distinct ids
(`<id>~<copy>`); every copy after the first is varied (a "Copy k." first line, its paragraphs or sentences
rotated by k, one word dropped), so no two documents are the same. Before timing, a warm-up `sift profile --gpus 1`
of one copy converts the GGUF into the sift cache and fills Triton's cache, and a second one, with warm caches,
measures the tokens of one copy and the one-GPU throughput; the number of copies is then the smallest that reaches
--tokens (fewer only if the estimated time would not fit --budget seconds, which the JSON then says).

    # on a 2-GPU machine, in one call (the data travels in a carried folder, e.g. .gpuw/data):
    SIFT_DATA_DIR=.gpuw/data python3 experiments/two_gpus.py --out $OUT/two_gpus.json --budget 540
    # CPU check that the script runs (timings mean nothing):
    python experiments/two_gpus.py --small --device cpu --out /tmp/two_gpus.json

Holds when both runs' bits are identical for every doc_id, `sift validate` is clean on both, and the two-GPU run
is at least 1.8× the one-GPU run in documents per second. Progress goes to stderr; the JSON is rewritten after
every step, so a run stopped by a time limit still leaves what it measured.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sift_cli.lab.datasets import data_dir, essay_records, nq_passages, nq_records, write_jsonl

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def base_records(data: Path, essay_words: int, small: bool) -> list[dict]:
    essays, nq = [], []
    try:
        essays = essay_records(data, essay_words)
    except Exception as exc:  # noqa: BLE001 - either source alone will do
        log(f"no essays: {exc}")
    try:
        nq = nq_passages(nq_records(data))
    except Exception as exc:  # noqa: BLE001
        log(f"no NQ passages: {exc}")
    if small:
        essays, nq = essays[:3], nq[:4]
    records = essays + nq
    if not records:
        raise SystemExit(f"no essays or NQ passages under {data}")
    return records


def vary(rec: dict, k: int) -> dict:
    """Copy k of a record under id `<id>~<k>`; copies after the first differ in content, not only in id."""
    out = {**rec, "id": f"{rec['id']}~{k:03d}"}
    if k == 0:
        return out
    text = rec["text"]
    paras = [p for p in text.split("\n") if p.strip()]
    if len(paras) > 1:
        r = k % len(paras)
        text = "\n".join(paras[r:] + paras[:r])
    else:
        sentences = re.split(r"(?<=[.!?])\s+", text.strip())
        r = k % len(sentences)
        text = " ".join(sentences[r:] + sentences[:r])
    words = list(re.finditer(r"\S+", text))
    if len(words) > 8:
        w = words[(k * 7919) % len(words)]
        text = text[:w.start()] + text[w.end():].lstrip(" ")
    out["text"] = f"Copy {k}.\n{text}"
    return out


def write_corpus(records: list[dict], copies: int, path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for k in range(copies):
            for r in records:
                f.write(json.dumps(vary(r, k), ensure_ascii=False) + "\n")
                n += 1
    return n


def sift(*args: str, timeout: float | None = None) -> dict:
    """Run `python -m sift_cli.cli ARGS`; {rc, wall_s, report (its --json), stderr tail}."""
    cmd = [sys.executable, "-m", "sift_cli.cli", *map(str, args)]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return {"rc": "timeout", "wall_s": round(time.perf_counter() - t, 3), "cmd": " ".join(cmd),
                "stderr": (exc.stderr or b"")[-2000:].decode(errors="replace") if isinstance(exc.stderr, bytes)
                else str(exc.stderr or "")[-2000:]}
    res = {"rc": p.returncode, "wall_s": round(time.perf_counter() - t, 3), "cmd": " ".join(cmd),
           "stderr": p.stderr[-2000:]}
    try:
        res["report"] = json.loads(p.stdout)
    except ValueError:
        res["stdout"] = p.stdout[-2000:]
    return res


def bit_table(d: Path) -> pa.Table | None:
    parts = sorted(d.glob("part-*.parquet"))
    if not parts:
        return None
    tables = [pq.read_table(p, columns=["doc_id", "la_bits", "ca_bits"]).replace_schema_metadata(None)
              for p in parts]
    return pa.concat_tables(tables).sort_by("doc_id")


def compare_bits(a_dir: Path, b_dir: Path) -> dict:
    """The bit columns of two shard sets per doc_id, byte for byte; and whether the part files are identical."""
    a, b = bit_table(a_dir), bit_table(b_dir)
    if a is None or b is None:
        return {"same_bits": False, "error": "no shards in one of the runs"}
    res = {"docs_one": a.num_rows, "docs_two": b.num_rows}
    same_ids = a.column("doc_id").equals(b.column("doc_id"))
    same = same_ids and a.column("la_bits").equals(b.column("la_bits")) and \
        a.column("ca_bits").equals(b.column("ca_bits"))
    res["same_bits"] = bool(same)
    if not same:
        da = dict(zip(a.column("doc_id").to_pylist(), zip(a.column("la_bits").to_pylist(),
                                                           a.column("ca_bits").to_pylist())))
        db = dict(zip(b.column("doc_id").to_pylist(), zip(b.column("la_bits").to_pylist(),
                                                           b.column("ca_bits").to_pylist())))
        res["only_one"] = sorted(set(da) - set(db))[:20]
        res["only_two"] = sorted(set(db) - set(da))[:20]
        diff = [k for k in set(da) & set(db) if da[k] != db[k]]
        res["differing_docs"] = len(diff)
        res["differing_examples"] = sorted(diff)[:20]
    names_a = sorted(p.name for p in a_dir.glob("part-*.parquet"))
    names_b = sorted(p.name for p in b_dir.glob("part-*.parquet"))
    res["identical_files"] = names_a == names_b and all(
        filecmp.cmp(a_dir / n, b_dir / n, shallow=False) for n in names_a)
    return res


def validate_both(dirs: list[Path], timeout: float) -> list[dict]:
    """`sift validate DIR --json` on each directory, in parallel."""
    procs = [subprocess.Popen([sys.executable, "-m", "sift_cli.cli", "validate", str(d), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in dirs]
    out = []
    for d, p in zip(dirs, procs):
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out.append({"dir": str(d), "ok": None, "error": "timeout"})
            continue
        try:
            r = json.loads(stdout)
            out.append({"dir": str(d), "ok": r.get("ok"), "documents": r.get("documents"),
                        "problems": (r.get("problems") or [])[:10]})
        except ValueError:
            out.append({"dir": str(d), "ok": False, "rc": p.returncode, "error": stderr[-500:]})
    return out


def run_row(name: str, res: dict) -> dict:
    rep = res.get("report") or {}
    workers = rep.get("per_worker") or []
    st = rep.get("startup") or {}
    docs = rep.get("profiled", 0)
    wall = res["wall_s"]
    return {"run": name, "rc": res["rc"], "workers": rep.get("workers"), "tokens": rep.get("tokens"),
            "documents": docs, "wall_s": wall,
            "startup_worker_max_s": st.get("worker_max_seconds"), "startup_launcher_s": st.get("launcher_seconds"),
            "worker_s": [w.get("seconds") for w in workers],
            "startup_phases": [(w.get("startup") or {}).get("phases") for w in workers],
            "prepare": [w.get("prepare") for w in workers],
            "tokens_per_s": round(rep.get("tokens", 0) / wall, 1) if wall else None,
            "docs_per_s": round(docs / wall, 2) if wall else None}


def environment() -> dict:
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": sys.version.split()[0]}
    for key, cmd in (("commit", ["git", "rev-parse", "--short", "HEAD"]),
                     ("gpus", ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])):
        try:
            env[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            env[key] = None
    try:
        from importlib.metadata import version
        env["torch"], env["transformers"] = version("torch"), version("transformers")
    except Exception:  # noqa: BLE001
        pass
    env["cpus"] = os.cpu_count()
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--data", default=None, help="folder with the essays and/or NQ (default: $SIFT_DATA_DIR, "
                                                  "../shared/data)")
    ap.add_argument("--work", default=None, help="where the corpus and shards go (default: a new temp folder)")
    ap.add_argument("--tokens", type=float, default=5e7, help="document tokens to reach (default 5e7)")
    ap.add_argument("--essay-words", type=int, default=1200)
    ap.add_argument("--gpus", type=int, default=2, help="workers of the second run (the first has 1)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None, help="sift profile --model (default: the bundled SmolLM2)")
    ap.add_argument("--num-shards", type=int, default=128)
    ap.add_argument("--budget", type=float, default=540.0, help="seconds the whole script may take (the corpus is "
                                                                 "cut if the estimate does not fit)")
    ap.add_argument("--small", action="store_true", help="a few short documents, 2 copies (CPU check)")
    args = ap.parse_args()

    if args.small:
        args.num_shards, args.essay_words = 4, 40
    work = Path(args.work or tempfile.mkdtemp(prefix="sift-two-gpus-"))
    work.mkdir(parents=True, exist_ok=True)
    data = data_dir(args.data)
    result = {"environment": environment(), "args": vars(args), "work": str(work), "data": str(data)}

    def save():
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))

    model = ["--model", args.model] if args.model else []
    records = base_records(data, args.essay_words, args.small)
    base = write_jsonl([vary(r, 0) for r in records], work / "one-copy.jsonl")
    for name in ("warmup", "measure"):  # the first fills the caches; the second runs as the timed runs will
        log(f"{len(records)} base documents: {name} run")
        result[name] = sift("profile", base, "--out", work / name, "--gpus", 1, "--device", args.device,
                            "--num-shards", min(8, args.num_shards), "--json", *model, timeout=args.budget)
        save()
        if result[name]["rc"] != 0:
            log(f"{name} failed: {result[name]['stderr'][-800:]}")
            raise SystemExit(1)
    wrep = result["measure"]["report"]
    per_copy = wrep["tokens"]
    worker_s = max(w["seconds"] - ((w.get("startup") or {}).get("seconds") or 0) for w in wrep["per_worker"])
    rate = per_copy / max(worker_s, 1e-3)  # tokens/s of one GPU, corpus read and tokenisation included
    copies = 2 if args.small else max(2, math.ceil(args.tokens / per_copy))
    left = args.budget - (time.perf_counter() - T0)
    # the one-GPU run, the two-GPU run at half its time, each ~15 s of start-up and reading, then ~45 s for
    # writing the corpus, comparing and validating
    est = lambda c: 1.5 * (c * per_copy / rate) + 75  # noqa: E731
    reduced = False
    while not args.small and copies > 2 and est(copies) > left:
        copies -= 1
        reduced = True
    result["plan"] = {"tokens_per_copy": per_copy, "measured_tokens_per_s": round(rate, 1), "copies": copies,
                      "target_tokens": args.tokens, "expected_tokens": copies * per_copy,
                      "estimated_s": round(est(copies), 1), "reduced_for_budget": reduced}
    log(f"{per_copy:,} tokens per copy, ~{rate:,.0f} tokens/s on one GPU: {copies} copies "
        f"({copies * per_copy:,} tokens){' — reduced to fit --budget' if reduced else ''}")
    corpus = work / "corpus.jsonl"
    result["plan"]["documents"] = write_corpus(records, copies, corpus)
    save()

    for name, gpus in (("one", 1), ("two", args.gpus)):
        left = args.budget - (time.perf_counter() - T0)
        log(f"sift profile --gpus {gpus} ({left:.0f} s of the budget left)")
        result[name] = sift("profile", corpus, "--out", work / name, "--gpus", gpus, "--device", args.device,
                            "--num-shards", args.num_shards, "--json", *model, timeout=max(30.0, left))
        result.setdefault("table", []).append(run_row(f"--gpus {gpus}", result[name]))
        log(f"  rc {result[name]['rc']}, {result[name]['wall_s']:.1f} s")
        save()

    log("comparing bits; sift validate on both")
    result["bits"] = compare_bits(work / "one", work / "two")
    save()
    result["validate"] = validate_both([work / "one", work / "two"],
                                       timeout=max(60.0, args.budget - (time.perf_counter() - T0)))
    one, two = result["table"]
    speedup = (two["docs_per_s"] / one["docs_per_s"]) if one.get("docs_per_s") and two.get("docs_per_s") else None
    two["speedup"] = round(speedup, 3) if speedup else None
    result["holds"] = bool(result["bits"].get("same_bits") and all(v.get("ok") for v in result["validate"])
                           and speedup and speedup >= 1.8 and (one["tokens"] or 0) >= args.tokens)
    result["total_s"] = round(time.perf_counter() - T0, 1)
    save()

    print(f"{'run':9} {'tokens':>11} {'docs':>8} {'time s':>7} {'start-up s (launcher)':>22} {'tokens/s':>9} "
          f"{'docs/s':>8} {'speed-up':>8}")
    for r in result["table"]:
        startup = f"{r['startup_worker_max_s'] or 0:.1f} ({r['startup_launcher_s'] or 0:.1f})"
        print(f"{r['run']:9} {r['tokens'] or 0:>11,} {r['documents'] or 0:>8,} {r['wall_s']:>7.1f} {startup:>22} "
              f"{r['tokens_per_s'] or 0:>9,.0f} {r['docs_per_s'] or 0:>8,.1f} {r.get('speedup') or 1.0:>8.2f}")
    print(json.dumps({"same_bits": result["bits"].get("same_bits"), "identical_files":
                      result["bits"].get("identical_files"), "validate_ok": [v.get("ok") for v in result["validate"]],
                      "holds": result["holds"], "plan": result["plan"], "total_s": result["total_s"]}))


if __name__ == "__main__":
    main()
