"""One JSON result per benchmark or evaluation run: what was measured (every row), how (the protocol), and where
and with what (command line, commit, device, library versions), so a published table can be regenerated from the
file alone (`sift_cli.lab.report`).

The commit is the source tree's (`git rev-parse`), or `SIFT_COMMIT` where the tree is not a git checkout (a copy
on a GPU machine); it is marked `+dirty` when the checkout has uncommitted changes to tracked files.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULT_FORMAT = 1
_ROOT = Path(__file__).resolve().parents[2]


def source_commit() -> str | None:
    """The commit the running code came from: `SIFT_COMMIT` when set, else the checkout's HEAD (None outside
    one)."""
    env = os.environ.get("SIFT_COMMIT", "").strip()
    if env:
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              cwd=_ROOT, timeout=5).stdout.strip()
        if not head:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=_ROOT, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except Exception:
        return None


def versions() -> dict:
    """torch, CUDA, transformers and the GPU driver (None where absent)."""
    out: dict = {"python": platform.python_version()}
    try:
        import torch

        out.update(torch=torch.__version__, cuda=torch.version.cuda)
        out["triton"] = _version("triton")
    except ImportError:
        out.update(torch=None, cuda=None)
    out["transformers"] = _version("transformers")
    out["driver"] = _driver()
    return out


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:
        return None


def device_description() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    except ImportError:
        return f"CPU ({platform.machine()})"


def command_line(argv: list[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    name = Path(argv[0]).name if argv else "sift"
    if name in ("__main__.py", "sift", "-m", "-c") or name.startswith("python"):
        name = "sift"
    return " ".join([name] + [_quote(a) for a in argv[1:]])


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(str(arg))


def make_result(kind: str, rows: list, protocol: dict | str | None = None, extra: dict | None = None,
                argv: list[str] | None = None) -> dict:
    """The result object: provenance first, then the protocol, then every row (and `extra`: a run's other keys)."""
    return {"result_format": RESULT_FORMAT, "kind": kind, "command": command_line(argv), "commit": source_commit(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
            "device": device_description(), "versions": versions(), "protocol": protocol,
            **(extra or {}), "rows": rows}


def as_result(kind: str, result, protocol=None) -> dict:
    """A command's result (a dict with `rows`, a dict without, or a list of rows) as a result object; one that
    already is one is returned as it is."""
    if isinstance(result, dict) and result.get("result_format"):
        return result
    if isinstance(result, list):
        return make_result(kind, result, protocol)
    rest = {k: v for k, v in result.items() if k != "rows"}
    protocol = protocol if protocol is not None else rest.pop("protocol", None)
    return make_result(kind, list(result.get("rows", [])), protocol, rest)


def write_result(path: str | Path, kind: str, rows, protocol=None, extra: dict | None = None) -> Path:
    """Write one result file (atomically: a reader never sees half of one); its path."""
    from ..atomic import atomic_write

    obj = as_result(kind, rows, protocol) if extra is None else make_result(kind, rows, protocol, extra)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(obj)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, default=_default) + "\n"


def _default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def read_result(path: str | Path) -> dict:
    obj = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(obj, dict) or "rows" not in obj or "kind" not in obj:
        from ..errors import SiftError

        raise SiftError(f"{path}: not a sift result file (no kind/rows)")
    return obj
