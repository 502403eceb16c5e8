"""Named kill points for the fault tests: with `SIFT_KILL_AT=<stage>` in its environment a writer SIGKILLs itself
when it reaches that stage, so a test can stop a real process at a chosen instant (between a file's write and its
rename, say) and check what the next run makes of what is left. Unset (always, outside the tests), a stage costs
one environment lookup.

Stages of a file written through `atomic.atomic_write`: `<kind>:before-write`, `<kind>:before-rename` (the
temporary is complete, not yet in place) and `<kind>:after-rename`, where kind is that of `file_kind`. Other
stages are named where they are reached (`manifest:locked`, `gguf:converted`, ...); docs/concurrency.md lists
them.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

KILL_ENV = "SIFT_KILL_AT"


def kill_point(stage: str) -> None:
    """SIGKILL this process when `SIFT_KILL_AT` names `stage`."""
    if os.environ.get(KILL_ENV) == stage:
        os.kill(os.getpid(), signal.SIGKILL)


def file_kind(path: Path) -> str:
    """The kind of a file a writer puts in place: part, bucket (store), store-header, manifest, config, record or
    file."""
    name = Path(path).name
    if name.startswith("part-") and name.endswith(".parquet"):
        return "part"
    if name.endswith(".sbits"):
        return "bucket"
    if name == "set.json":
        return "store-header"
    if name == "manifest.parquet":
        return "manifest"
    if name.endswith(".toml"):
        return "config"
    if name.endswith(".json") and Path(path).parent.name.startswith("."):
        return "record"
    return "file"
