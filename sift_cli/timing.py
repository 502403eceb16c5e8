"""A block's wall time added to a dict of phases. Standard library only, so launchers can use it without torch."""

from __future__ import annotations

import contextlib
import time


@contextlib.contextmanager
def add_time(phases: dict | None, name: str):
    """Add the block's wall time, in seconds, to phases[name]; nothing when phases is None."""
    t = time.perf_counter()
    try:
        yield
    finally:
        if phases is not None:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t


# The one rule for a printed speed-up (docs/cli.md, "Timing"): the median of at least MIN_RUNS timed runs of each
# mode after at least MIN_WARMUPS untimed ones. On a CPU one cold run of a 317-token prompt moved by 2x between
# runs, more than the attention SIFT saves, so a speed-up from fewer runs is withheld, not printed.
MIN_RUNS = 3
MIN_WARMUPS = 1
# On a CPU the unset defaults take the warm median only for prompts up to this many tokens: its eight forwards of
# a 1K-token prompt with the bundled model take seconds, at 6K tokens minutes.
CPU_WARM_MEDIAN_TOKENS = 1024


def timing_defaults(device_type: str, prompt_tokens: int | None = None) -> dict:
    """Timed runs and warm-ups of each mode when the caller sets neither: the warm median (MIN_RUNS runs after
    MIN_WARMUPS warm-ups) on a GPU, and on a CPU for prompts up to CPU_WARM_MEDIAN_TOKENS tokens; one cold run
    otherwise (its timings check, they print no speed-up). prompt_tokens None: a prompt of unknown length."""
    if device_type == "cuda" or (prompt_tokens is not None and prompt_tokens <= CPU_WARM_MEDIAN_TOKENS):
        return {"repeat": MIN_RUNS, "warmup": MIN_WARMUPS}
    return {"repeat": 1, "warmup": 0}


def timing_protocol(repeat: int, warmup: int) -> dict:
    """What a run of `repeat` timed runs after `warmup` warm-ups may claim: its protocol ("warm_median" when it
    meets the rule, "single_cold_run" or "too_few_runs" otherwise), and when a speed-up is withheld, why and how
    to get one."""
    repeat, warmup = max(1, repeat), max(0, warmup)
    out = {"protocol": "warm_median", "repeat": repeat, "warmup": warmup, "speedup_withheld": None}
    if repeat >= MIN_RUNS and warmup >= MIN_WARMUPS:
        return out
    out["protocol"] = "single_cold_run" if repeat == 1 and warmup == 0 else "too_few_runs"
    what = "one cold run of each mode" if out["protocol"] == "single_cold_run" else (
        f"{repeat} timed run{'s' * (repeat > 1)} after {warmup} warm-up{'s' * (warmup != 1)}")
    out["speedup_withheld"] = (f"no speed-up from {what}: a speed-up needs the median of {MIN_RUNS} runs after "
                               f"a warm-up (--warmup {MIN_WARMUPS} --repeat {MIN_RUNS})")
    return out
