"""How every measurement command ends: --save, --plot, then one JSON object (--json) or the tables."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .console import err, print_json


def check_outputs(save: Path | None = None, plot: Path | None = None, results: Path | None = None) -> None:
    """The files a measurement writes when it ends, checked before it starts (`lab.runs.check_output_files`)."""
    from ..lab.runs import check_output_files

    check_output_files(save, plot, results)


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
