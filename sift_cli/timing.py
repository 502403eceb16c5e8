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
