"""`sift bench kernels`: cuDNN SDPA (dense causal), FlexAttention (the same block lists) and the SIFT CUDA kernel,
side by side in one process on the same inputs and lists; plus the bit-vector decode kernel's time per layer.

Two kinds of layouts:
- `causal`: one segment (a plain causal prompt), every block touching the diagonal listed and each other causal
  block with probability 1.0 / 0.3 / 0.1: the kernel's throughput per computed tile;
- `documents`: document-aligned block tables (SPEC §6 v2) of real-shaped prompts — a 16-token prefix, documents
  of random lengths, a 32-token suffix — with bits drawn at the paper's densities (LA 27.3% of tiles, CA 5.8% of
  pages), decoded by the CUDA decoder; `cells/allowed` is SPEC §6's fidelity measure.

Throughput is counted over computed (query, key) pairs exactly: FLOPs = 4 · D · Σ causal pairs inside the listed
blocks (2 GEMMs × 2 FLOPs per multiply-add); for the dense causal case this is 2·L²·D·H up to the diagonal's
half, the convention of H200.md. Inputs are random bf16 laid out as the model lays them out ([L, heads, D]).

FlexAttention gets its best shot: its block mask is built from the same document-aligned block table
(`attention.flex_layout`) once per layout, its compiled kernel reused across calls; the gathers into its padded
layout are part of its timed call. Its output is checked against the kernel's over every head (`agree`), and a
disagreement above 1e-2 is flagged, not hidden.

Each row says how it was timed (`timing`): "graph", the GPU time of CUDA-graph replays (no host launch overhead:
how a graphed prefill runs the kernels), or "eager", CUDA events around launches; medians after warm-up.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...attention.base import BlockLists
from ...attention.flex import FlexBackend
from ...block_lists import allowed_cells, computed_cells
from ...block_table import BlockTable
from ...cuda.plan import SparseAttentionPlan
from ...cuda.checks import document_layout, random_block_lists
from ...cuda.decode import CudaDecoder
from ...errors import SiftError
from ...layout import random_prompt_bits
from .decode_kernel import bench_decode
from .kernel_tables import markdown, render  # noqa: F401  (the CLI renders through this module)
from .kernel_timing import graph_time_ms, time_ms
from .prefill_cases import PAPER_CA_DENSITY, PAPER_LA_DENSITY

SHAPES = ((32, 8, 128), (9, 3, 64))  # (H, H_kv, D): Llama-3-8B-like, SmolLM2-135M
LENGTHS = (16384, 32768, 65536)
DENSITIES = (1.0, 0.3, 0.1)
BLOCK_NS = (128, 64)
BLOCK_MS = (128, 64)  # query block rows: two consumer warpgroups per CTA, or one with two CTAs per SM
AGREE_BOUND = 1e-2
DOC_LENGTHS = {(32, 8, 128): (300, 3000), (9, 3, 64): (450, 650)}  # 8B RAG documents; SmolLM2 NQ-like passages


# ----------------------------------------------------------------------------------------------------------
# The three attention implementations
# ----------------------------------------------------------------------------------------------------------

def model_layout_inputs(H: int, H_kv: int, L: int, D: int, seed: int = 0):
    """q [H, L, D], k/v [H_kv, L, D] as views of [L, heads, D] tensors (the model's own layout), random bf16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(L, H, D, device="cuda", generator=g).to(torch.bfloat16).transpose(0, 1)
    k = torch.randn(L, H_kv, D, device="cuda", generator=g).to(torch.bfloat16).transpose(0, 1)
    v = torch.randn(L, H_kv, D, device="cuda", generator=g).to(torch.bfloat16).transpose(0, 1)
    return q, k, v


def cudnn_dense_fn(q, k, v, scale):
    """SDPA pinned to cuDNN, dense causal; inputs [H, L, D] → adds the batch dim."""
    q4, k4, v4 = q[None], k[None], v[None]
    group = q.shape[0] // k.shape[0]

    def run_gqa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale, enable_gqa=True)

    try:
        run_gqa()
        torch.cuda.synchronize()
        return run_gqa, "gqa"
    except Exception:
        ke, ve = k4.repeat_interleave(group, 1), v4.repeat_interleave(group, 1)

        def run_expanded():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q4, ke, ve, is_causal=True, scale=scale)

        run_expanded()
        torch.cuda.synchronize()
        return run_expanded, "kv expanded"


def flex_fn(q, k, v, blocks: BlockLists, scale):
    """The `flex` backend of `sift prefill` on these block lists, its BlockMask prepared outside the timed call."""
    attend = FlexBackend().prepare(blocks.table, [blocks])

    def run():
        return attend(0, q, k, v, scale)

    run()
    torch.cuda.synchronize()
    return run


def sift_fn(q, k, v, blocks: BlockLists, scale, **variant):
    """The kernel through a prepared plan (what a prefill layer runs), writing the model's [L, H, D] layout."""
    plan = SparseAttentionPlan(blocks.table, blocks.offsets[None], blocks.indices[None], q.shape[0], k.shape[0],
                               q.shape[2], scale, **variant)
    out = torch.empty(q.shape[1], q.shape[0], q.shape[2], dtype=torch.bfloat16, device="cuda").transpose(0, 1)

    def run():
        return plan(0, q, k, v, out=out)

    return run


def block_lists_flops(blocks: BlockLists, head_dim: int) -> int:
    return computed_cells(blocks) * 4 * head_dim


# ----------------------------------------------------------------------------------------------------------
# Layouts
# ----------------------------------------------------------------------------------------------------------

def document_case(H: int, L: int, block_n: int, seed: int, lengths: tuple[int, int], block_m: int = 128):
    """(block lists of one layer over a document-aligned table, cells/allowed) for a real-shaped prompt with
    bits at the paper's densities, decoded by the CUDA decoder."""
    rng = np.random.default_rng(seed)
    layout = document_layout(rng, L, *lengths)

    def off_diagonal(p: int) -> float:
        total = p * (p + 1) / 2
        return 0.0 if p == 1 else min(1.0, max(0.0, (PAPER_LA_DENSITY * total - p) / (total - p)))

    bits = random_prompt_bits(layout, 64, 1, H, off_diagonal, PAPER_CA_DENSITY, rng)[0].to("cuda")
    table = BlockTable.for_layout(layout, block_m, block_n)
    blocks = CudaDecoder(bits, table).layer(0)
    return blocks, computed_cells(blocks) / max(1, allowed_cells(bits, 0)), len(layout.docs)


def variant_layouts(H: int, H_kv: int, D: int, L: int, block_n: int, block_m: int) -> dict[str, BlockLists]:
    """The layouts kernel variants are timed on: causal with every block and with 10 % of them (random lists,
    seed 3), and a document layout (`document_case`, seed 5)."""
    table = BlockTable.causal(L, block_m, block_n, device="cuda")
    return {"causal 100%": random_block_lists(table, H, 1.0, seed=3),
            "causal 10%": random_block_lists(table, H, 0.1, seed=3),
            "documents": document_case(H, L, block_n, 5, DOC_LENGTHS[(H, H_kv, D)], block_m)[0]}


def variant_cases(shapes, L: int):
    """Every case kernel variants are compared on, as (H, H_kv, D, q, k, v, block_n, block_m, layout, blocks): for
    each shape (H, H_kv, D) its inputs at L tokens (`model_layout_inputs`), both table widths, both query block
    sizes and the `variant_layouts`."""
    for H, H_kv, D in shapes:
        q, k, v = model_layout_inputs(H, H_kv, L, D)
        for block_n in (64, 128):
            for block_m in (128, 64):
                for name, blocks in variant_layouts(H, H_kv, D, L, block_n, block_m).items():
                    yield H, H_kv, D, q, k, v, block_n, block_m, name, blocks


def interleaved_ms(fns: dict, rounds: int) -> dict:
    """Median ms of each of `fns` (`time_ms`) over `rounds` rounds that take every function in turn, so a drift of
    the device's speed touches them alike."""
    times = {n: [] for n in fns}
    for _ in range(rounds):
        for n, fn in fns.items():
            times[n].append(time_ms(fn))
    return {n: float(np.median(t)) for n, t in times.items()}


# ----------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------

TIMINGS = ("graph", "eager")


def protocol(timing: str) -> str:
    how = {"graph": "GPU time of CUDA-graph replays (no host launch overhead), as a graphed prefill runs them",
           "eager": "CUDA events around eager launches (host launch overhead included where it shows)",
           "both": "each row twice: 'graph' (CUDA-graph replays) and 'eager' (events around launches)"}[timing]
    return (f"bf16, batch 1, inputs in the model's [L, heads, D] layout; {how}; medians after warm-up; every "
            "implementation on the same inputs and lists in one process; FlexAttention's block mask built once per "
            "layout from the same document-aligned block table, its gathers inside the timed call")


def timed_ms(fn, timing: str) -> float | None:
    """fn's GPU ms as `timing` says (graph: None where the capture fails)."""
    return graph_time_ms(fn, reps=20) if timing == "graph" else time_ms(fn)


def _attention_rows(q, k, v, blocks: BlockLists, layout: str, scale: float, cudnn_tflops: dict, flex: bool,
                    row_base: dict, log, timings=("graph",)) -> list[dict]:
    D = q.shape[2]
    flops = block_lists_flops(blocks, D)
    fns = {"SIFT cuda": sift_fn(q, k, v, blocks, scale)}
    if layout == "documents":  # the same lists with a tile per block, as the kernel ran them before merging
        fns["SIFT cuda, tile per block"] = sift_fn(q, k, v, blocks, scale, merge=False)
    notes, failed = {}, None
    if flex:
        try:
            fns["FlexAttention"] = flex_fn(q, k, v, blocks, scale)
            a, b = fns["FlexAttention"]().float(), fns["SIFT cuda"]().float()  # every head of both
            agree = float((a - b).norm() / b.norm())
            notes["FlexAttention"] = dict(agree=agree, note=f"rel diff vs sift {agree:.1e}"
                                          + (" DISAGREE" if agree > AGREE_BOUND else ""))
        except Exception as exc:  # record, keep going
            fns.pop("FlexAttention", None)
            failed = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    rows = []
    msg = f"  {layout} bm={blocks.block_m} bn={blocks.block_n} density={blocks.density():.2f}:"
    for timing in timings:
        ms = {name: timed_ms(fn, timing) for name, fn in fns.items()}
        first = len(rows)
        for name, t in ms.items():
            tf = None if not t else flops / t / 1e9
            row = dict(row_base, impl=name, timing=timing, ms=t, tflops=tf, **notes.get(name, {}))
            if name.startswith("SIFT") and tf is not None and cudnn_tflops.get(timing):
                row["pct_of_cudnn"] = 100.0 * tf / cudnn_tflops[timing]
            if t is None:
                row["note"] = "CUDA-graph capture failed"
            rows.append(row)
        if ms.get("FlexAttention") and ms.get("SIFT cuda"):
            rows[first]["speedup_vs_flex"] = ms["FlexAttention"] / ms["SIFT cuda"]
        if failed:
            rows.append(dict(row_base, impl="FlexAttention", timing=timing, ms=None, tflops=None, note=failed))
        msg += f" [{timing}] " + ", ".join(f"{n} {t:.3f} ms" if t else f"{n} -" for n, t in ms.items())
    log(msg)
    return rows


def run_kernel_bench(quick: bool = False, shapes=SHAPES, lengths=None, densities=None, block_ns=BLOCK_NS,
                     block_ms=BLOCK_MS, flex: bool = True, decode: bool = True, documents: bool = True,
                     time_budget_s: float | None = None, log=print, checkpoint=None, timings=("graph",),
                     causal: bool = True, flex_causal: bool = True) -> list[dict]:
    """All rows of the kernel table (docs/benchmarks.md). quick: L = 16K only and densities 100% / 10%. timings:
    "graph" and/or "eager" (`TIMINGS`), one row per implementation each. flex_causal: FlexAttention on the causal
    layouts too (each layout compiles Flex anew), not only on the document ones."""
    if not torch.cuda.is_available():
        raise SiftError("sift bench kernels needs a CUDA GPU (Hopper for the bundled kernels)")
    lengths = lengths or ((16384,) if quick else LENGTHS)
    densities = densities or ((1.0, 0.1) if quick else DENSITIES)
    t0 = time.time()
    rows: list[dict] = []
    for L in lengths:
        for H, H_kv, D in shapes:
            q, k, v = model_layout_inputs(H, H_kv, L, D, seed=L + D)
            scale = 1.0 / math.sqrt(D)
            dense_flops = 4 * D * H * L * (L + 1) // 2
            run, how = cudnn_dense_fn(q, k, v, scale)
            cudnn_tflops = {}
            for timing in timings:
                ms = timed_ms(run, timing)
                cudnn_tflops[timing] = dense_flops / ms / 1e9 if ms else None
                rows.append(dict(kind="attention", impl="cuDNN SDPA", layout="causal", H=H, H_kv=H_kv, D=D, L=L,
                                 block_n=None, density=1.0, timing=timing, ms=ms, tflops=cudnn_tflops[timing],
                                 note=how))
                log(f"H={H} D={D} L={L} cuDNN dense [{timing}]: " + (f"{ms:.3f} ms" if ms else "capture failed"))
            for bn, bm in itertools.product(block_ns, block_ms):
                use_flex = flex and not (time_budget_s is not None and time.time() - t0 > time_budget_s)
                table = BlockTable.causal(L, bm, bn, device="cuda")
                for dens in densities if causal else ():
                    blocks = random_block_lists(table, H, dens, seed=L + bn)
                    base = dict(kind="attention", layout="causal", H=H, H_kv=H_kv, D=D, L=L, block_m=bm, block_n=bn,
                                density=blocks.density())
                    rows += _attention_rows(q, k, v, blocks, "causal", scale, cudnn_tflops, use_flex and flex_causal,
                                            base, log, timings)
                if documents:
                    lo, hi = DOC_LENGTHS.get((H, H_kv, D), (300, 3000))
                    blocks, ratio, n_docs = document_case(H, L, bn, L + bn, (lo, hi), bm)
                    base = dict(kind="attention", layout=f"{n_docs} docs of {lo}-{hi}", H=H, H_kv=H_kv, D=D, L=L,
                                block_m=bm, block_n=bn, density=blocks.density(), cells_over_allowed=ratio)
                    rows += _attention_rows(q, k, v, blocks, "documents", scale, cudnn_tflops, use_flex, base, log,
                                            timings)
                if checkpoint:
                    checkpoint(rows)
            del q, k, v
            torch.cuda.empty_cache()
    if decode:
        rows += bench_decode(lengths=(15360,) if quick else (15360, 32768, 65536), log=log, timings=timings)
    return rows
