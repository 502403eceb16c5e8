"""The `sift` command line: one module per command group, each parsing flags, calling one library (or lab)
function and rendering its result with rich or as one JSON object. Errors the user can fix become one line.

- `profile`  sift profile
- `shards`   sift inspect, validate, status, ids, index, sample-corpus
- `prefill`  sift prefill, demo-prefill
- `check`    sift check-model
- `eval`     sift eval recall | build-qa | qa | sweep | frontier | storage
- `calibrate` sift calibrate
- `bench`    sift bench kernels | profile | prefill | store
- `report`   sift report (the docs' tables from committed results)

Commands import the library and the lab when they run, so that `sift --help` does not load torch.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from ..errors import SiftError, debug_enabled, error_line
from ..output_dirs import disk_full_error, is_disk_full
from . import check, prefill, profile, report, shards
from .bench import bench_app
from .console import Interrupted, OutputClosed, err
from .calibrate import calibrate
from .eval import eval_app

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False,
                  help="Profile a RAG corpus offline into attention bit vectors; run sparse prefill online.")
app.command()(profile.profile)
app.command()(shards.inspect)
app.command()(shards.validate)
app.command()(shards.status)
app.command()(shards.ids)
app.command()(shards.index)
app.command()(prefill.prefill)
app.command("demo-prefill", hidden=True)(prefill.demo_prefill)
app.command("check-model")(check.check_model)
app.add_typer(bench_app, name="bench")
app.command("sample-corpus")(shards.sample_corpus)
app.add_typer(eval_app, name="eval")
app.command("calibrate")(calibrate)
app.command("report")(report.report)


def main() -> None:
    debug = debug_enabled()
    try:
        rc = app(standalone_mode=False)  # click returns (not raises) the code of typer.Exit here
        if rc == 130:  # typer turned a Ctrl-C into a silent Exit(130)
            err.print("[red]interrupted[/]")
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except SiftError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] {escape(str(exc))}")
        for line in getattr(exc, "details", ()):
            err.print(f"  {escape(line)}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except OutputClosed:  # the reader went away (`sift ids DIR | head -1`): end quietly, as Unix tools do
        _quiet_stdout()
        sys.exit(0)
    except Interrupted as exc:
        err.print(f"[red]interrupted[/] — {escape(str(exc))}")
        sys.exit(130)
    except (typer.Abort, KeyboardInterrupt):
        err.print("[red]interrupted[/]")
        sys.exit(130)
    except Exception as exc:  # usage errors and the unexpected: one line, no traceback
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):  # typer's click exceptions
            exc.show()
            sys.exit(exc.exit_code)
        if debug:
            raise
        if is_disk_full(exc):  # a command that knows its output folder says it itself (sift profile)
            full = disk_full_error(exc)
            err.print(f"[red]error:[/] {escape(str(full))}")
            sys.exit(full.exit_code)
        err.print(f"[red]error:[/] {escape(error_line(exc))} (set SIFT_DEBUG=1 for the traceback)")
        sys.exit(1)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still buffered for the closed
    pipe does not fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (a test's capture)
        pass


