"""What grid query blocks cost in cells on SmolLM2's real prompts (the ones `smollm2_prefill.py` and
`graphed_variants.py` time): every layer decoded with 64-row query blocks cut per segment and on the global grid,
64-key blocks; computed cells over causal cells, cells over the pairs the bits allow (SPEC §6) and the number of
query blocks. Runs on a CPU (profiling the passages and essays it needs first, about a minute on 2 cores).

    python experiments/query_block_cells.py --data-dir DATA --out query_block_cells.json
"""

from __future__ import annotations

import argparse
import json

from sift_cli.block_lists import cells_over_allowed, computed_cells, decode_layers
from sift_cli.block_table import BlockTable
from sift_cli.lab.eval.prompt_sets import smollm2_real_prompts
from sift_cli.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="query_block_cells.json")
    ap.add_argument("--work", default="/tmp/query-block-cells")
    ap.add_argument("--block-m", type=int, default=64)
    args = ap.parse_args()
    lm = load_model(None, device="cpu")
    rows = []
    for name, prompt in smollm2_real_prompts(lm, args.data_dir, args.work):
        bits = prompt.bits
        L = bits.layout.seq_len
        causal = lm.n_layers * lm.n_heads * L * (L + 1) // 2
        row = {"prompt": name, "tokens": L, "documents": len(bits.layout.docs),
               "selected_share": bits.selected_share()}
        for query_blocks in ("segment", "grid"):
            table = BlockTable.for_layout(bits.layout, args.block_m, 64, query_blocks)
            layers = decode_layers(bits, table, lm.n_layers)
            cells = [computed_cells(b) for b in layers]
            row[query_blocks] = {"query_blocks": table.n_query_blocks, "cell_density": sum(cells) / causal,
                                 "cells_over_allowed": cells_over_allowed(bits, layers, cells)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'prompt':16} {'tokens':>6}  {'segment: blocks, density, cells/allowed':>40}  {'grid: the same':>30}")
    for r in rows:
        s, g = r["segment"], r["grid"]
        print(f"{r['prompt']:16} {r['tokens']:6d}  {s['query_blocks']:22d} {s['cell_density']:8.4f} "
              f"{s['cells_over_allowed']:8.4f}  {g['query_blocks']:12d} {g['cell_density']:8.4f} "
              f"{g['cells_over_allowed']:8.4f}")


if __name__ == "__main__":
    main()
