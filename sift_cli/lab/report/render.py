"""Markdown tables and the number formats of the published tables (fixed, so a table renders the same every
time from the same result)."""

from __future__ import annotations


def num(x, nd: int = 1) -> str:
    """A number with `nd` decimals and thousands separators; `–` for none."""
    if x is None or x == "":
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def pct(x, nd: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{nd}f} %"


def ratio(x, nd: int = 3) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def tokens(n) -> str:
    if n is None:
        return "–"
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; pipes inside cells escaped."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])
