"""How every measurement command ends: --save, --plot, then one JSON object (--json) or the tables."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .console import err, print_json


def finish(result: dict, save: Path | None, plot: Path | None, plot_name: str, as_json: bool,
           render: Callable[[dict], object], plot_of: Callable[[dict], object] = lambda r: r) -> None:
    """The lab writes the files (`lab.runs.save_outputs`); the figure's path goes to stderr."""
    from ..lab.runs import save_outputs  # the lab loads torch: only when a command has run

    written = save_outputs(result, save, plot, plot_name, plot_of)
    if written is not None:
        err.print(f"wrote {written}")
    if as_json:
        print_json(result)
    else:
        render(result)
