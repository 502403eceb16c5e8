"""`sift report`: the docs' current tables rendered from the committed results (docs/results/*.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import SiftError
from .console import err, out


def report(
    docs: Path = typer.Option(Path("docs"), "--docs", help="folder of the pages whose marked tables are rendered"),
    results: Optional[Path] = typer.Option(None, "--results", help="folder of the result files (default: "
                                                                    "DOCS/results)"),
    check: bool = typer.Option(False, "--check", help="write nothing; exit 1 when a page's tables differ from "
                                                      "what the results render"),
):
    """Render every table marked `<!-- table:NAME -->` … `<!-- /table:NAME -->` in DOCS/*.md from its committed
    result (a result not committed yet: "not yet re-measured", with the command that produces it)."""
    from ..lab.report.pages import update

    if not docs.is_dir():
        raise SiftError(f"--docs {docs}: not a folder")
    stale = update(docs, results, check=check)
    if check:
        if stale:
            err.print(f"tables differ from the results in: {', '.join(stale)} (run `sift report`)")
            raise typer.Exit(1)
        out.print("every table matches its result")
    else:
        out.print(f"rewrote {', '.join(stale)}" if stale else "every table already matches its result")
