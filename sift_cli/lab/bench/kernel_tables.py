"""`sift bench kernels`' tables: the attention rows and the decode rows, as rich tables or Markdown."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

_COLUMNS = ("H/H_kv/D", "L", "layout", "Q block", "KV block", "density", "cells/allowed", "impl", "timing", "ms",
            "TFLOP/s", "% cuDNN", "× vs Flex", "note")


def _cells(r: dict) -> list[str]:
    return [f"{r['H']}/{r['H_kv']}/{r['D']}", f"{r['L'] // 1024}K", r.get("layout", "causal"),
            str(r.get("block_m") or "-"), str(r["block_n"] or "-"),
            f"{100 * r['density']:.0f}%", _f(r.get("cells_over_allowed"), 3), r["impl"], r.get("timing", "eager"),
            _f(r.get("ms"), 3),
            _f(r.get("tflops"), 0), _f(r.get("pct_of_cudnn"), 0), _f(r.get("speedup_vs_flex"), 2), r.get("note", "")]


def render(rows: list[dict]):
    """A rich Table of the rows (attention first, then decode)."""
    t = Table(title="Attention forward, bf16, batch 1 (TFLOP/s over computed causal pairs)")
    for col in _COLUMNS:
        t.add_column(col, justify="left" if col in ("impl", "note", "layout") else "right")
    for r in rows:
        if r.get("kind") == "attention":
            t.add_row(*_cells(r))
    d = Table(title="Bit-vector decode, every layer in one go (T=64, KV blocks of 64, documents of 2K tokens)")
    for col in ("layers × heads", "L", "timing", "CTAs", "ms / layer", "ms, all layers", "target ms / layer"):
        d.add_column(col, justify="right")
    for r in rows:
        if r.get("kind") == "decode":
            d.add_row(f"{r['layers']}×{r['heads']}", f"{r['L']}", r.get("timing", "-"), str(r.get("ctas", "-")),
                      _f(r["ms_per_layer"], 4), _f(r["ms_all_layers"], 3), _f(r.get("target_ms"), 3))
    return Group(t, d)


def markdown(rows: list[dict]) -> str:
    """The same tables as Markdown (for docs/benchmarks.md)."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows if r.get("kind") == "attention"]
    lines += ["", "| layers × heads | L | timing | CTAs | ms / layer | ms, all layers | target ms / layer |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("kind") == "decode":
            lines.append(f"| {r['layers']}×{r['heads']} | {r['L']} | {r.get('timing', '-')} | {r.get('ctas', '-')} | "
                         f"{_f(r['ms_per_layer'], 4)} | "
                         f"{_f(r['ms_all_layers'], 3)} | {_f(r.get('target_ms'), 3)} |")
    return "\n".join(lines)


def _f(x, nd):
    return "-" if x is None else f"{x:.{nd}f}"
