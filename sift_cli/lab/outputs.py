"""The files a measurement writes when it ends, checked before it starts. Torch-free, so a command checks them
without paying for the imports its measurement needs."""

from __future__ import annotations

from pathlib import Path

from ..errors import SiftError
from ..output_dirs import check_writable_dir
from . import plots


def check_output_files(save: Path | None = None, plot_path: Path | None = None, results: Path | None = None
                       ) -> None:
    """The files a measurement writes when it ends (--save, --plot, --results), checked before it starts: a
    measurement of minutes to hours is not lost to a folder given as a file, one that cannot be written, or a
    missing matplotlib."""
    for flag, path in (("--save", save), ("--plot", plot_path), ("--results", results)):
        if path is None:
            continue
        if Path(path).is_dir():
            raise SiftError(f"{flag} {path} is a folder — give the file to write")
        check_writable_dir(Path(path).parent, f"{flag}'s folder")
    if plot_path is not None:
        plots.check_available()
