"""Where a worker's start-up goes: the seconds from its process's start (or from `ProfileWorker.start`) until it
is ready to profile, by phase. Standard library only, so a launcher can use it without importing torch.

Phases (seconds; a phase a worker did not go through is absent):

- `python`: process start → this module imported: the interpreter, `sift_cli`, typer/rich, the CLI's parsing
  and whatever was imported before the worker module;
- `import_torch`, `import_sift`: torch, then the rest of sift's modules (pyarrow, numpy, ...);
- `import_transformers`, `weights_hash` (a GGUF's sha256, remembered in the sift cache), `gguf_cache` (GGUF →
  safetensors conversion, or waiting for the process that converts; ~0 once cached), `tokenizer`, `model`
  (`from_pretrained`), `cuda_context` (on a GPU), `to_device`: `models.load_model`;
- `read_corpus`: reading and checking the corpus, where the worker does it before loading the model;
- `config`: thresholds (flags, sift.toml);
- `warmup` (on a GPU): one tiny profiling batch, whose first CUDA kernels, Triton compilation (or loading from
  Triton's disk cache) and cuBLAS/cuDNN set-up would otherwise count as profiling;
- `other`: whatever the phases above leave out (rank detection, corpus path resolution, ...).

Whatever the job itself reads and tokenises afterwards is in the job report's `prepare`.
"""

from __future__ import annotations

import os
import time

from ..timing import add_time

_ORIGIN = time.perf_counter()  # when this module was first imported in this process
_marks: list[tuple[str, float]] = []  # (phase, perf_counter at its end) of the imports after _ORIGIN
_claimed = False  # the process start-up (interpreter, imports) is counted by the first clock only


def process_age() -> float | None:
    """Seconds since this process started (Linux: its start time in /proc against the boot-time clock, to ~10 ms);
    None where that is unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        start_ticks = int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22, starttime, in clock ticks
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if 0.0 <= age < 7 * 86400 else None


_AGE_AT_IMPORT = process_age()


def mark_imported(phase: str) -> None:
    """End an import phase now (called at module level, right after the imports it times)."""
    _marks.append((phase, time.perf_counter()))


class StartupClock:
    """The start-up phases of one worker.

    from_process_start: count from the process's start, including the interpreter and the imports (a worker that
    is its process's purpose: `sift profile`, each `--gpus N` child); only the first such clock of a process does.
    Otherwise the clock starts now (a worker inside a longer-lived process: Ray, a notebook, tests)."""

    def __init__(self, from_process_start: bool = False):
        global _claimed
        self.phases: dict[str, float] = {}
        self.origin = time.perf_counter()
        self.since = "worker start"
        if from_process_start and not _claimed:
            _claimed = True
            if _AGE_AT_IMPORT is not None:
                self.phases["python"] = _AGE_AT_IMPORT
            previous = _ORIGIN
            for phase, t in _marks:
                self.phases[phase] = t - previous
                previous = t
            self.origin = _ORIGIN - (_AGE_AT_IMPORT or 0.0)
            self.since = "process start" if _AGE_AT_IMPORT is not None else "sift_cli.launch.startup import"

    def phase(self, name: str):
        """`with clock.phase(name):` adds the block's time to that phase."""
        return add_time(self.phases, name)

    def finish(self) -> dict:
        """{seconds, since, phases}: the total from the origin to now and its phases; what no phase covers is
        `other`, so the phases add up to the total."""
        total = time.perf_counter() - self.origin
        phases = {k: round(v, 3) for k, v in self.phases.items()}
        rest = total - sum(self.phases.values())
        if rest >= 0.0005:
            phases["other"] = round(rest, 3)
        return {"seconds": round(total, 3), "since": self.since, "phases": phases}


def top_phases(startup: dict | None, n: int = 4) -> list[tuple[str, float]]:
    """The n longest phases of a start-up report, longest first."""
    phases = (startup or {}).get("phases") or {}
    return sorted(phases.items(), key=lambda kv: -kv[1])[:n]
