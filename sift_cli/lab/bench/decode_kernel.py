"""`sift bench kernels`' decode rows: what a prefill prepares for the attention kernel, timed for all layers of a
prompt at once (the decode kernel's lists, then the kernel's tiles and their work order)."""

from __future__ import annotations

import numpy as np

from ...attention.cuda import CudaBackend
from ...block_table import BlockTable
from ...cuda.checks import document_layout
from ...cuda.coalesce import KernelLists
from ...cuda.decode import CudaDecoder
from ...layout import random_prompt_bits
from .kernel_timing import graph_time_ms, time_ms
from .prefill_cases import PAPER_CA_DENSITY, PAPER_LA_DENSITY


HEAD_DIMS = {32: 128, 9: 64}  # heads → head_dim of the two shapes


def bench_decode(lengths=(15360, 32768, 65536), shapes=((32, 32), (30, 9)), block_n: int = 64,
                 log=print, timings=("graph",)) -> list[dict]:
    """Every layer decoded in one go (count, scan, write) and made the kernel's tiles (`KernelLists`: count, scan
    with the work order, write), GPU time per layer: the paper's shape (32 layers, 32 heads) and SmolLM2's (30, 9);
    2,048-token documents, bits at the paper's densities. The work order is the cuda backend's own
    (`CudaBackend.work_spec`: its persistent CTAs, one per SM for 128-row query blocks). timings: graph (replays)
    and/or eager (events around launches), one row each."""
    rows = []
    backend = CudaBackend()
    for n_layers, n_heads in shapes:
        for L in lengths:
            rng = np.random.default_rng(L)
            layout = document_layout(rng, L, 2048, 2048, prefix_len=48, suffix_len=96)
            bits = random_prompt_bits(layout, 64, n_layers, n_heads, PAPER_LA_DENSITY, PAPER_CA_DENSITY,
                                      rng)[0].to("cuda")
            table = BlockTable.for_layout(layout, 128, block_n).to("cuda")
            spec = backend.work_spec(table, table.device, HEAD_DIMS.get(n_heads, 128))

            def decode():  # what a prefill prepares: the lists, then the kernel's tiles and their work order
                dec = CudaDecoder(bits, table)
                KernelLists(dec.offsets, dec.indices, dec.table, spec)

            for timing in timings:
                ms = graph_time_ms(decode) if timing == "graph" else time_ms(decode, warmup=3, reps=20)
                rows.append(dict(kind="decode", L=L, layers=n_layers, heads=n_heads, tile=64, block_n=block_n,
                                 ctas=spec.ctas, ms_all_layers=ms, ms_per_layer=None if ms is None else ms / n_layers,
                                 timing=timing if ms is not None else f"{timing} (capture failed)",
                                 target_ms={15360: 0.04, 32768: 0.075, 65536: 0.14}.get(L)))
                if ms is not None:
                    log(f"decode {n_layers}x{n_heads} L={L}: {ms / n_layers:.4f} ms/layer GPU ({timing}; "
                        f"all layers {ms:.3f} ms; {spec.ctas} CTAs)")
    return rows
