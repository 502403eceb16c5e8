"""How every measurement command ends: --save/--out (one result file), --plot, then one JSON object (--json) or the
tables."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import typer

from .console import err, print_json

SaveOpt = typer.Option(None, "--save", "--out", help="write the result (rows, protocol, command, commit, device, "
                                                      "versions) as JSON here")


def check_outputs(save: Path | None = None, plot: Path | None = None, results: Path | None = None) -> None:
    """The files a measurement writes when it ends, checked before it starts (`lab.outputs.check_output_files`)."""
    from ..lab.outputs import check_output_files

    check_output_files(save, plot, results)


def finish(result, save: Path | None, plot: Path | None, plot_name: str | None, as_json: bool,
           render: Callable[[dict], object], plot_of: Callable[[dict], object] = lambda r: r,
           kind: str | None = None) -> None:
    """The lab writes the files (`lab.runs.save_outputs`); the figure's path goes to stderr. With `kind`, the
    result becomes a result object (`lab.results`): what --save writes and --json prints."""
    from ..lab.runs import save_outputs  # the lab loads torch: only when a command has run

    if kind is not None:
        from ..lab.results import as_result

        result = as_result(kind, result)
    written = save_outputs(result, save, plot, plot_name, plot_of)
    if written is not None:
        err.print(f"wrote {written}")
    if as_json:
        print_json(result)
    else:
        render(result)
