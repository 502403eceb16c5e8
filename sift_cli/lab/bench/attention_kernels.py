"""`sift bench kernels`: cuDNN SDPA (dense causal), FlexAttention (same block mask) and the SIFT CUDA kernel,
side by side in one process on the same inputs and masks; plus the bit-vector decode kernel's time per layer.

Throughput is counted over computed (query, key) pairs exactly: FLOPs = 4 · D · Σ causal pairs inside the listed
blocks (2 GEMMs × 2 FLOPs per multiply-add). For the dense causal case this is 2·L²·D·H up to the diagonal's
half, the convention of H200.md. Times are medians of CUDA-event-timed launches after warm-up, on random bf16
inputs. `run_kernel_bench(quick)` returns rows (dicts); `render(rows)` builds a rich table.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Group
from rich.table import Table
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...attention.base import BlockLists
from ...attention.flex import FlexBackend
from ...block_lists import causal_cells_per_block
from ...cuda.attention import BLOCK_M, sparse_attention_forward
from ...cuda.checks import random_block_lists
from ...cuda.decode import CudaDecoder
from ...errors import SiftError
from ...layout import PromptLayout, random_prompt_bits

SHAPES = ((32, 8, 128), (9, 3, 64))  # (H, H_kv, D): Llama-3-8B-like, SmolLM2-135M
LENGTHS = (16384, 32768, 65536)
DENSITIES = (1.0, 0.3, 0.1)
BLOCK_NS = (128, 64)


# ----------------------------------------------------------------------------------------------------------
# Layouts and FLOPs
# ----------------------------------------------------------------------------------------------------------

def block_lists_flops(blocks: BlockLists, head_dim: int) -> int:
    cells = causal_cells_per_block(blocks.seq_len, blocks.block_m, blocks.block_n, blocks.offsets.device)
    m = blocks.dense_mask()
    return int((m.to(torch.int64) * cells[None]).sum()) * 4 * head_dim


def block_density(blocks: BlockLists) -> float:
    return blocks.density()


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------------
# The three attention implementations
# ----------------------------------------------------------------------------------------------------------

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
    backend = FlexBackend()
    plan = backend.prepare(blocks)

    def run():
        return backend.forward(q, k, v, blocks, scale, plan=plan)

    run()
    torch.cuda.synchronize()
    return run


def sift_fn(q, k, v, blocks: BlockLists, scale, **variant):
    out = torch.empty_like(q)

    def run():
        return sparse_attention_forward(q, k, v, blocks, scale, out=out, **variant)

    return run


# ----------------------------------------------------------------------------------------------------------
# Decode benchmark
# ----------------------------------------------------------------------------------------------------------

def synthetic_prompt_bits(seq_len: int, n_layers: int = 30, n_heads: int = 9, tile: int = 64, doc_len: int = 2048,
                          prefix_len: int = 48, suffix_len: int = 96, la_p: float = 0.27, ca_p: float = 0.06,
                          seed: int = 0):
    """PromptBits for prefix + docs of doc_len tokens + suffix ≈ seq_len tokens, random bits at paper-like
    densities (LA 27% of tiles, diagonal always set; CA 6% of pages)."""
    n_docs = max(1, (seq_len - prefix_len - suffix_len) // doc_len)
    lengths = [doc_len] * n_docs
    lengths[-1] += max(0, seq_len - prefix_len - suffix_len - doc_len * n_docs)
    lay = PromptLayout.build(prefix_len, [f"d{i}" for i in range(n_docs)], lengths, suffix_len)
    return random_prompt_bits(lay, tile, n_layers, n_heads, la_p, ca_p, np.random.default_rng(seed))[0]


def graph_time_ms(fn, reps: int = 200) -> float | None:
    """GPU time of fn() from CUDA-graph replays (no host launch overhead); None if capture fails."""
    try:
        fn()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        return time_ms(g.replay, warmup=3, reps=reps) if reps else None
    except Exception:
        return None


def bench_decode(lengths=(15360, 32768, 65536), block_n: int = 64, log=print) -> list[dict]:
    rows = []
    for L in lengths:
        bits = synthetic_prompt_bits(L).to("cuda")
        dec = CudaDecoder(bits, BLOCK_M, block_n)  # pass 1 for all 30 layers (and compile)
        layer = dec.layers.stop // 2
        offsets = dec.offsets[layer]
        indices = torch.empty(int(dec.nnz[layer]), dtype=torch.int32, device="cuda")

        def per_layer():  # pass 1 + prefix sum + pass 2 for one layer, no host sync
            off = dec.count(layer, 1)[0]
            dec.write(layer, off, indices)

        def all_counts():
            dec.count(0, bits.n_layers)

        def write_only():
            dec.write(layer, offsets, indices)

        eager = time_ms(per_layer, warmup=5, reps=50)
        g_layer = graph_time_ms(per_layer)
        g_counts = graph_time_ms(all_counts, reps=50)
        g_write = graph_time_ms(write_only)
        ms_layer = g_layer if g_layer is not None else eager
        amortised = (g_counts / bits.n_layers + g_write) if (g_counts is not None and g_write is not None) else None
        rows.append(dict(kind="decode", L=L, layers=bits.n_layers, heads=bits.n_heads, tile=bits.tile,
                         block_n=block_n, nnz=int(dec.nnz[layer]), ms_per_layer=ms_layer, ms_eager=eager,
                         ms_amortised=amortised, ms_count_all_layers=g_counts, ms_write=g_write,
                         timing="cuda graph" if g_layer is not None else "eager",
                         target_ms={15360: 0.04, 32768: 0.075, 65536: 0.14}.get(L)))
        log(f"decode L={L}: {ms_layer:.4f} ms/layer GPU ({rows[-1]['timing']}; eager incl. host launches "
            f"{eager:.4f}), amortised {amortised}")
    return rows


# ----------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------

def run_kernel_bench(quick: bool = False, shapes=SHAPES, lengths=None, densities=None, block_ns=BLOCK_NS,
                     flex: bool = True, decode: bool = True, time_budget_s: float | None = None,
                     log=print, checkpoint=None) -> list[dict]:
    """All rows of the kernel table (docs/benchmarks.md). quick: L = 16K only and densities 100% / 10%."""
    if not torch.cuda.is_available():
        raise SiftError("sift bench kernels needs a CUDA GPU (Hopper for the bundled kernels)")
    lengths = lengths or ((16384,) if quick else LENGTHS)
    densities = densities or ((1.0, 0.1) if quick else DENSITIES)
    t0 = time.time()
    rows: list[dict] = []
    torch.manual_seed(0)
    for L in lengths:
        for H, H_kv, D in shapes:
            q = torch.randn(H, L, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(H_kv, L, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(H_kv, L, D, device="cuda", dtype=torch.bfloat16)
            scale = 1.0 / math.sqrt(D)
            dense_flops = 4 * D * H * L * (L + 1) // 2
            run, how = cudnn_dense_fn(q, k, v, scale)
            ms = time_ms(run)
            cudnn_tflops = dense_flops / ms / 1e9
            rows.append(dict(kind="attention", impl="cuDNN SDPA", H=H, H_kv=H_kv, D=D, L=L, block_n=None,
                             density=1.0, ms=ms, tflops=cudnn_tflops, note=how))
            log(f"H={H} D={D} L={L} cuDNN dense: {ms:.3f} ms {cudnn_tflops:.0f} TFLOP/s ({how})")
            for bn in block_ns:
                for dens in densities:
                    blocks = random_block_lists(H, L, bn, dens, seed=L + bn)
                    flops = block_lists_flops(blocks, D)
                    row_base = dict(kind="attention", H=H, H_kv=H_kv, D=D, L=L, block_n=bn,
                                    density=blocks.density())
                    ms_sift = time_ms(sift_fn(q, k, v, blocks, scale))
                    tf = flops / ms_sift / 1e9
                    rows.append(dict(row_base, impl="SIFT cuda", ms=ms_sift, tflops=tf,
                                     pct_of_cudnn=100.0 * tf / cudnn_tflops))
                    msg = f"  bn={bn} density={blocks.density():.2f}: sift {ms_sift:.3f} ms {tf:.0f} TFLOP/s"
                    over = time_budget_s is not None and time.time() - t0 > time_budget_s
                    if flex and not over:
                        try:
                            frun = flex_fn(q, k, v, blocks, scale)
                            ms_flex = time_ms(frun)
                            tf_flex = flops / ms_flex / 1e9
                            a, b = frun()[0].float(), sift_fn(q, k, v, blocks, scale)().float()
                            agree = float((a - b).norm() / b.norm())
                            rows.append(dict(row_base, impl="FlexAttention", ms=ms_flex, tflops=tf_flex,
                                             note=f"rel diff vs sift {agree:.1e}"))
                            rows[-2]["speedup_vs_flex"] = ms_flex / ms_sift
                            msg += f" | flex {ms_flex:.3f} ms {tf_flex:.0f} TFLOP/s"
                        except Exception as exc:  # record, keep going
                            rows.append(dict(row_base, impl="FlexAttention", ms=None, tflops=None,
                                             note=f"failed: {type(exc).__name__}: {str(exc)[:160]}"))
                            msg += f" | flex failed: {type(exc).__name__}"
                    elif flex:
                        rows.append(dict(row_base, impl="FlexAttention", ms=None, tflops=None,
                                         note="skipped: time budget"))
                    log(msg)
                    del blocks
            del q, k, v
            torch.cuda.empty_cache()
            if checkpoint:
                checkpoint(rows)
    if decode:
        rows += bench_decode(lengths=(15360,) if quick else (15360, 32768, 65536), log=log)
    return rows


def render(rows: list[dict]):
    """A rich Table of the rows (attention first, then decode)."""
    t = Table(title="Attention forward, bf16, batch 1 (TFLOP/s over computed causal pairs)")
    for col in ("H/H_kv/D", "L", "KV block", "density", "impl", "ms", "TFLOP/s", "% cuDNN", "× vs Flex", "note"):
        t.add_column(col, justify="right" if col not in ("impl", "note") else "left")
    for r in rows:
        if r.get("kind") != "attention":
            continue
        t.add_row(f"{r['H']}/{r['H_kv']}/{r['D']}", f"{r['L'] // 1024}K", str(r["block_n"] or "-"),
                  f"{100 * r['density']:.0f}%", r["impl"], _f(r.get("ms"), 3), _f(r.get("tflops"), 0),
                  _f(r.get("pct_of_cudnn"), 0), _f(r.get("speedup_vs_flex"), 2), r.get("note", ""))
    d = Table(title="Bit-vector decode (SmolLM2 shape: 30 layers, 9 heads, T=64, docs of 2K tokens)")
    for col in ("L", "KV block", "ms / layer", "amortised ms / layer", "target ms"):
        d.add_column(col, justify="right")
    for r in rows:
        if r.get("kind") == "decode":
            d.add_row(f"{r['L']}", str(r["block_n"]), _f(r["ms_per_layer"], 4), _f(r.get("ms_amortised"), 4),
                      _f(r.get("target_ms"), 3))

    return Group(t, d)


def markdown(rows: list[dict]) -> str:
    """The same table as Markdown (for docs/benchmarks.md)."""
    lines = ["| H/H_kv/D | L | KV block | density | impl | ms | TFLOP/s | % cuDNN | × vs Flex | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("kind") == "attention":
            lines.append(f"| {r['H']}/{r['H_kv']}/{r['D']} | {r['L'] // 1024}K | {r['block_n'] or '-'} | "
                         f"{100 * r['density']:.0f}% | {r['impl']} | {_f(r.get('ms'), 3)} | {_f(r.get('tflops'), 0)} | "
                         f"{_f(r.get('pct_of_cudnn'), 0)} | {_f(r.get('speedup_vs_flex'), 2)} | {r.get('note', '')} |")
    lines += ["", "| L | KV block | ms / layer (pass 1 + scan + pass 2) | amortised ms / layer | target ms |",
              "|---|---|---|---|---|"]
    for r in rows:
        if r.get("kind") == "decode":
            lines.append(f"| {r['L']} | {r['block_n']} | {_f(r['ms_per_layer'], 4)} | {_f(r.get('ms_amortised'), 4)} | "
                         f"{_f(r.get('target_ms'), 3)} |")
    return "\n".join(lines)


def _f(x, nd):
    return "-" if x is None else f"{x:.{nd}f}"
