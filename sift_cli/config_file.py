"""`sift.toml`: the profile thresholds `sift calibrate` chose, which `sift profile` takes as its defaults.

Where: `--config PATH`, else `$SIFT_CONFIG`, else `./sift.toml` in the working directory (like other tools'
project files: it travels with the corpus and the scripts that profile it). Format:

    # written by `sift calibrate` …
    [profile]
    tile = 64
    alpha = 0.001
    beta = 0.01
    gamma = 0.1

    [calibration]            # what the choice rests on (informational)
    model = "…"
    weights = "sha256:…"
    target = "kl <= 0.001"
    …

This module reads and writes the file; `config.resolve_profile_config` decides what wins over what.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .atomic import atomic_write, remove_dead_temporaries
from .errors import SiftError

FILE_NAME = "sift.toml"
THRESHOLD_KEYS = ("tile", "alpha", "beta", "gamma")
RULE_KEYS = ("rule", "epsilon", "ca_epsilon")  # a calibration that chose the mass rule (`config.RULES`)


def config_path(explicit: str | Path | None = None) -> Path | None:
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise SiftError(f"--config {explicit}: file not found")
        return p
    env = os.environ.get("SIFT_CONFIG")
    if env:
        p = Path(env)
        if not p.is_file():
            raise SiftError(f"$SIFT_CONFIG={env}: file not found")
        return p
    p = Path.cwd() / FILE_NAME
    return p if p.is_file() else None


def _parse_toml(text: str, origin: str) -> dict:
    try:
        import tomllib  # Python 3.11+

        return tomllib.loads(text)
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        pass
    except Exception as exc:
        raise SiftError(f"{origin}: not valid TOML ({exc})") from exc
    # Python 3.10: the flat subset this module writes (sections, key = number | "string" | true/false)
    out: dict = {}
    section = out
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = out.setdefault(line[1:-1].strip(), {})
            continue
        if "=" not in line:
            raise SiftError(f"{origin}:{lineno}: expected key = value")
        key, value = (s.strip() for s in line.split("=", 1))
        try:
            section[key] = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SiftError(f"{origin}:{lineno}: cannot read value {value!r}") from exc
    return out


def read_config(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SiftError(f"{path}: cannot read ({exc})") from exc
    data = _parse_toml(text, str(path))
    prof = data.get("profile", {})
    if not isinstance(prof, dict):
        raise SiftError(f"{path}: [profile] must be a table")
    unknown = set(prof) - set(THRESHOLD_KEYS) - set(RULE_KEYS)
    if unknown:
        raise SiftError(f"{path}: unknown key {sorted(unknown)[0]!r} in [profile] (known: "
                        f"{', '.join(THRESHOLD_KEYS + RULE_KEYS)})")
    for key, value in prof.items():
        if key == "rule":
            if value not in ("paper", "mass"):
                raise SiftError(f"{path}: [profile] rule must be \"paper\" or \"mass\"")
        elif not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SiftError(f"{path}: [profile] {key} must be a number")
    return data


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    return f'"{s}"'


def write_config(path: str | Path, profile: dict, calibration: dict, comment: str = "") -> Path:
    """Write (replace) the file; keys of other sections are not kept: the file is the calibration's output."""
    p = Path(path)
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    lines.append("[profile]")
    lines.extend(f"{k} = {_toml_value(profile[k])}" for k in THRESHOLD_KEYS + RULE_KEYS if k in profile)
    lines.append("")
    lines.append("[calibration]")
    lines.extend(f"{k} = {_toml_value(v)}" for k, v in calibration.items() if v is not None)
    text = "\n".join(lines) + "\n"
    atomic_write(p, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))  # a temporary of its own per process
    remove_dead_temporaries(p.parent, f".{p.name}.*.tmp")  # a killed calibration's
    return p
