"""Flags the lab's commands share, parsed: comma-separated number lists, threshold grids, the model to load and
the progress bars (`sift eval …`, `sift calibrate`)."""

from __future__ import annotations

from ..errors import SiftError
from .console import progress


def numbers(text: str, name: str, kind, what: str) -> list:
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SiftError(f"{name} {text!r}: expected comma-separated {what}") from None
    if not vals:
        raise SiftError(f"{name}: no values")
    return vals


def floats(text: str, name: str) -> list[float]:
    return numbers(text, name, float, "numbers")


def ints(text: str, name: str) -> list[int]:
    return numbers(text, name, int, "integers")


def model_spec(model, device, dtype, threads):
    from ..lab.runs import ModelSpec

    return ModelSpec(model, device, dtype, threads)


def progress_bars(as_json: bool):
    """The lab's progress bars: one per phase on a terminal, none with --json."""
    return lambda description: progress(description, not as_json)


def threshold_points(points, tiles, alphas, betas, gammas):
    """The paper rule's candidates: explicit 'T,α,β,γ;…' points, else the grid of the four lists."""
    from ..lab.eval.sweep import grid, parse_points

    if points:
        return parse_points(points)
    return grid(ints(tiles, "--tiles"), floats(alphas, "--alphas"), floats(betas, "--betas"),
                floats(gammas, "--gammas"))
