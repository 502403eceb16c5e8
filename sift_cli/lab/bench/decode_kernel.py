"""`sift bench kernels`' decode rows: what a prefill prepares for the attention kernel, timed for all layers of a
prompt at once (the decode kernel's lists, then the kernel's tiles and their work order)."""

from __future__ import annotations

import numpy as np

from ...block_table import BlockTable
from ...cuda.checks import document_layout
from ...cuda.coalesce import KernelLists
from ...cuda.decode import CudaDecoder, WorkSpec
from ...cuda.runtime import sm_count
from ...cuda.work_order import SPLIT_MAX, SPLIT_MIN_BLOCKS
from ...layout import random_prompt_bits
from .kernel_timing import graph_time_ms, time_ms
from .prefill_cases import PAPER_CA_DENSITY, PAPER_LA_DENSITY


def bench_decode(lengths=(15360, 32768, 65536), shapes=((32, 32), (30, 9)), block_n: int = 64,
                 log=print) -> list[dict]:
    """Every layer decoded in one go (count, scan, write) and made the kernel's tiles (`KernelLists`: count, scan
    with the work order, write), GPU time per layer: the paper's shape (32 layers, 32 heads) and SmolLM2's (30, 9);
    2,048-token documents, bits at the paper's densities."""
    rows = []
    for n_layers, n_heads in shapes:
        for L in lengths:
            rng = np.random.default_rng(L)
            layout = document_layout(rng, L, 2048, 2048, prefix_len=48, suffix_len=96)
            bits = random_prompt_bits(layout, 64, n_layers, n_heads, PAPER_LA_DENSITY, PAPER_CA_DENSITY,
                                      rng)[0].to("cuda")
            table = BlockTable.for_layout(layout, 128, block_n).to("cuda")
            spec = WorkSpec(2 if block_n == 64 else 1, 2 * sm_count(table.device), SPLIT_MAX, SPLIT_MIN_BLOCKS)

            def decode():  # what a prefill prepares: the lists, then the kernel's tiles and their work order
                dec = CudaDecoder(bits, table)
                KernelLists(dec.offsets, dec.indices, dec.table, spec)

            eager = time_ms(decode, warmup=3, reps=20)
            graphed = graph_time_ms(decode)
            ms = graphed if graphed is not None else eager
            rows.append(dict(kind="decode", L=L, layers=n_layers, heads=n_heads, tile=64, block_n=block_n,
                             ms_all_layers=ms, ms_per_layer=ms / n_layers, ms_eager_all_layers=eager,
                             timing="cuda graph" if graphed is not None else "eager",
                             target_ms={15360: 0.04, 32768: 0.075, 65536: 0.14}.get(L)))
            log(f"decode {n_layers}x{n_heads} L={L}: {ms / n_layers:.4f} ms/layer GPU ({rows[-1]['timing']}; "
                f"all layers {ms:.3f} ms)")
    return rows
