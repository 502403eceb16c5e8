"""Terminal output of the CLI: rich consoles, a progress bar that stays quiet off a terminal, JSON printing, number
formats."""

from __future__ import annotations

import contextlib
import datetime
import json
import sys

from rich.console import Console, ConsoleDimensions
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
from rich.text import Text

from ..sizes import binary_bytes as human_bytes  # noqa: F401  (the commands' byte format)

LOG_WIDTH = 1000  # columns of a console that is not a terminal: tables in logs keep every value whole


class _Console(Console):
    """A rich console whose width, off a terminal (a log file, a pipe), is LOG_WIDTH rather than rich's 80, so
    tables are never cut ("403,…"); on a terminal it is the terminal's."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        if self.is_terminal or self._width is not None:
            return size
        return ConsoleDimensions(LOG_WIDTH, size.height)

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)

    def on_broken_pipe(self) -> None:
        """The reader of our output went away (`sift inspect DIR | head -1`): stop writing; `cli.main` ends with
        exit 0, as Unix tools do (rich's default exits 1)."""
        self.quiet = True
        raise OutputClosed


class OutputClosed(Exception):
    """The reader of stdout went away (a broken pipe: `sift ids DIR | head -1`). Not an OSError, which click
    would turn into exit 1 before `cli.main` sees it; `main` ends quietly with exit 0, as Unix tools do."""


class Interrupted(Exception):
    """Ctrl-C in a command that can say what to do next (the message): shown as `interrupted — <message>`, exit
    130. (typer turns a bare KeyboardInterrupt into a silent exit 130; `main` says "interrupted" for those.)"""


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)


class TimeLeftColumn(ProgressColumn):
    """Time left at the average rate since the start. (rich's TimeRemainingColumn estimates the speed from the
    updates of the last 30 seconds, so when one update takes longer, a profiling batch on a CPU, it never shows a
    time.)"""

    def render(self, task) -> Text:
        if not task.total or not task.completed or not task.elapsed:
            return Text("-:--:--", style="progress.remaining")
        if task.finished:
            return Text("0:00:00", style="progress.remaining")
        left = task.elapsed * (task.total - task.completed) / task.completed
        return Text(str(datetime.timedelta(seconds=int(left))), style="progress.remaining")


def print_json(obj) -> None:
    _write(json.dumps(obj, indent=2, sort_keys=False, default=_default) + "\n")


def print_plain(lines) -> None:
    """Lines on stdout exactly as given (tabs kept, no markup, no wrapping): output meant for `cut`, `grep`."""
    for line in lines:
        _write(line + "\n", flush=False)
    _write("")


def _write(text: str, flush: bool = True) -> None:
    try:
        sys.stdout.write(text)
        if flush:
            sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed from None


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
    with Progress(*columns, TimeLeftColumn(), console=err, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt(x, nd=3) -> str:
    """A number for a table: `-` for None, small floats in %g."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e-2 and x != 0 else f"{x:.{nd}f}"
    return str(x)
