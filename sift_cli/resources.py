"""Find files that ship beside the code: `schemas/` and `kernels/` at the repository root, or the copies a
wheel installs as `sift_cli/_schemas` and `sift_cli/_kernels`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def resource_path(kind: str, name: str) -> Path:
    """kind: 'schemas' or 'kernels'."""
    local = _ROOT / kind / name
    if local.is_file():
        return local
    packaged = Path(str(resources.files(f"sift_cli._{kind}") / name))
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(f"{kind}/{name} is missing from this installation")
