"""Two GPUs against one: the same corpus profiled by one worker and by `--gpus 2`; bits per doc_id must
match and the two-GPU run should take about half the time. Uses a ~0.6B-parameter random-weight Llama built here
(so no weights travel) and the essays as the corpus.

    python experiments/two_gpus.py --data DIR --out F [--gpus 2] [--device cuda]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from sift_cli.lab.datasets import essay_records, write_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests.helpers builds checkpoints
from tests.helpers import tiny_checkpoint  # noqa: E402  (a real on-disk checkpoint with a trained tokenizer)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny model and corpus (CPU plumbing check)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sift-two-"))
    if args.small:
        ck = tiny_checkpoint(work / "ck", layers=2, heads=4, kv_heads=2, head_dim=16, max_pos=2048)
        recs = essay_records(args.data, 150)[:6]
    else:
        ck = tiny_checkpoint(work / "ck", layers=16, heads=16, kv_heads=8, head_dim=128, max_pos=8192)
        recs = [{**r, "id": f"{r['id']}-{k}"} for k in range(8) for r in essay_records(args.data, 1200)]
    corpus = write_jsonl(recs, work / "corpus.jsonl")
    base = [sys.executable, "-m", "sift_cli.cli", "profile", str(corpus), "--model", str(ck), "--num-shards", "8",
            "--json", "--device", args.device]
    result = {}
    for name, extra in (("one", []), ("two", ["--gpus", str(args.gpus)])):
        t = time.perf_counter()
        p = subprocess.run(base + ["--out", str(work / name)] + extra, capture_output=True, text=True)
        wall = time.perf_counter() - t
        result[name] = {"rc": p.returncode, "wall_s": wall, "stderr": p.stderr[-800:]}
        if p.returncode == 0:
            try:
                result[name]["report"] = json.loads(p.stdout)
            except json.JSONDecodeError:
                result[name]["stdout"] = p.stdout[-800:]

    def rows(d):
        out = {}
        for f in sorted((work / d).glob("part-*.parquet")):
            t = pq.read_table(f, columns=["doc_id", "la_bits", "ca_bits"])
            for i, la, ca in zip(*(t.column(c).to_pylist() for c in ("doc_id", "la_bits", "ca_bits"))):
                out[i] = (la, ca)
        return out

    a, b = rows("one"), rows("two")
    result["docs"] = len(a)
    result["same_bits"] = a == b
    result["speedup"] = result["one"]["wall_s"] / result["two"]["wall_s"] if result["two"]["wall_s"] else None
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({"docs": result["docs"], "same_bits": result["same_bits"], "one_s": result["one"]["wall_s"],
                      "two_s": result["two"]["wall_s"], "speedup": result["speedup"],
                      "rc": [result["one"]["rc"], result["two"]["rc"]],
                      "tokens": result["one"].get("report", {}).get("tokens"),
                      "one_profile_tok_s": result["one"].get("report", {}).get("tokens_per_second"),
                      "two_worker_s": [w.get("seconds") for w in result["two"].get("report", {}).get("per_worker", [])]}))
    for name in ("one", "two"):
        if result[name]["rc"]:
            print(name, result[name]["stderr"])


if __name__ == "__main__":
    main()
