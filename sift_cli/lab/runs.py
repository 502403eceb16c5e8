"""What every measurement run shares: loading the model with a thread count, the run's own record (date, model,
device, machine, commit), writing results (`--save`, `--plot`, per-question JSONL that a re-run resumes from),
and progress bars handed in by the caller.
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator

import torch

from ..models import LoadedModel, load_model
from . import plots

Progress = Callable[[int, int], None]  # progress(done, total)
ProgressBar = Callable[[str], ContextManager[Progress]]  # progress_bar(description) → a bar for one phase


@contextlib.contextmanager
def no_progress(description: str) -> Iterator[Progress]:
    yield lambda done, total: None


@dataclass(frozen=True)
class ModelSpec:
    """The model a measurement runs (--model, --device, --dtype) and torch's CPU threads (0: its default)."""

    model: str | None = None
    device: str | None = "auto"
    dtype: str | None = "auto"
    threads: int = 0

    def load(self) -> LoadedModel:
        if self.threads:
            torch.set_num_threads(self.threads)
        return load_model(self.model, device=self.device, dtype=self.dtype)


def run_metadata(lm: LoadedModel | None) -> dict:
    """When, with what and where a result was measured; the commit of the source tree (`results.source_commit`)."""
    from .results import source_commit

    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "model": lm.name if lm else None,
            "device": str(lm.device) if lm else None, "machine": platform.node(), "commit": source_commit()}


def write_json(path: Path | None, obj) -> None:
    """A result file written whole or not at all (`lab.results`' format when obj is a result object)."""
    if path is None:
        return
    from ..atomic import atomic_write
    from .results import dumps

    text = dumps(obj)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def plot(name: str, result, path: Path | None) -> Path | None:
    """`plots.<name>(result, path)` when a path is given; the file written."""
    return getattr(plots, name)(result, path) if path is not None else None


def save_outputs(result: dict, save: Path | None, plot_path: Path | None, plot_name: str,
                 plot_of: Callable[[dict], object] = lambda r: r) -> Path | None:
    """--save (the result as JSON) then --plot (a figure of `plot_of(result)`); the figure's path."""
    write_json(save, result)
    return plot(plot_name, plot_of(result), plot_path)


def read_results(path: Path | None) -> dict:
    """Per-item results already in a JSONL file, by key (a line cut by an interrupted run is skipped)."""
    if path is None or not path.is_file():
        return {}
    done = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[r["key"]] = r
    return done


def append_result(path: Path | None, r: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
