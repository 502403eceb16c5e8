"""Terminal output of the CLI: rich consoles, a progress bar that stays quiet off a terminal, JSON printing, number
formats."""

from __future__ import annotations

import contextlib
import json
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=_default) + "\n")
    sys.stdout.flush()


def _default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__fspath__"):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@contextlib.contextmanager
def progress(description: str, enabled: bool = True, unit: str | None = None):
    """Yield a callback(done, total) that drives a progress bar on stderr, only when stderr is a terminal."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda done, total: None
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn(unit)] if unit else []
    with Progress(*columns, TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def fmt(x, nd=3) -> str:
    """A number for a table: `-` for None, small floats in %g."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e-2 and x != 0 else f"{x:.{nd}f}"
    return str(x)
