"""The profile configuration, resolved in one place: flags over `sift.toml` over the device defaults.

`ProfileConfig` is what a profiling run reads: the thresholds (T, α, β, γ), the padded tokens per forward batch,
the memory budget of the statistics, and which statistics path runs. `resolve_profile_config` builds it for the
device a model runs on: every field a caller sets wins; the thresholds it does not set come from `sift.toml`
when the caller reads the file (`sift profile` does, the evaluations do not); everything else from the
built-in thresholds and the device defaults below, which are defined here and nowhere else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from .config_file import config_path, read_config
from .errors import SiftError

THRESHOLDS = {"tile": 64, "alpha": 1e-3, "beta": 1e-2, "gamma": 0.10}
STATS_PATHS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class DeviceDefaults:
    batch_tokens: int  # padded tokens per profiling forward
    stats_budget_bytes: int  # memory the attention statistics may hold at once


CPU_DEFAULTS = DeviceDefaults(batch_tokens=16384, stats_budget_bytes=256 << 20)
GPU_DEFAULTS = DeviceDefaults(batch_tokens=65536, stats_budget_bytes=2 << 30)


def device_defaults(device) -> DeviceDefaults:
    """The defaults of a device (a torch.device or its name): the GPU ones on CUDA, else the CPU ones."""
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    return GPU_DEFAULTS if kind == "cuda" else CPU_DEFAULTS


@dataclass(frozen=True)
class ProfileConfig:
    tile: int = THRESHOLDS["tile"]
    alpha: float = THRESHOLDS["alpha"]
    beta: float = THRESHOLDS["beta"]
    gamma: float = THRESHOLDS["gamma"]
    batch_tokens: int = CPU_DEFAULTS.batch_tokens
    stats_budget_bytes: int = CPU_DEFAULTS.stats_budget_bytes
    stats: str = "auto"  # statistics path: torch (reference), triton (fast), auto (triton on CUDA)

    def check(self) -> None:
        if self.tile not in (16, 32, 64, 128, 256):
            raise SiftError(f"--tile {self.tile}: must be a power of two from 16 to 256")
        for name in ("alpha", "beta", "gamma"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise SiftError(f"--{name} {v}: must be between 0 and 1")
        if self.batch_tokens < 1:
            raise SiftError("--batch-tokens must be positive")
        if self.stats not in STATS_PATHS:
            raise SiftError(f"--stats {self.stats}: expected one of {', '.join(STATS_PATHS)}")

    def thresholds(self) -> dict:
        return {"tile_size": self.tile, "alpha": self.alpha, "beta": self.beta, "gamma": self.gamma}


def profile_defaults(explicit: str | Path | None = None, lm=None) -> dict:
    """{tile, alpha, beta, gamma, source, warning}: the built-in thresholds overridden by the config file's
    [profile]. When the file was calibrated for other weights than `lm`'s, `warning` says so (the thresholds are
    still used: the user asked for this file)."""
    out = dict(THRESHOLDS, source="built-in defaults", warning=None)
    path = config_path(explicit)
    if path is None:
        return out
    data = read_config(path)
    for key, value in data.get("profile", {}).items():
        out[key] = int(value) if key == "tile" else float(value)
    out["source"] = str(path)
    cal = data.get("calibration", {})
    if lm is not None and cal.get("weights") and cal.get("weights") != lm.fingerprint:
        out["warning"] = (f"{path} was calibrated for weights {str(cal.get('weights'))[:24]}…, not the model "
                          f"being profiled ({lm.fingerprint[:24]}…); its thresholds are used anyway")
    return out


@dataclass(frozen=True)
class ResolvedConfig:
    profile: ProfileConfig
    source: str  # where the thresholds came from: a sift.toml path or "built-in defaults"
    warning: str | None = None


def resolve_profile_config(device, overrides: Mapping[str, Any] | None = None, *, read_file: bool = False,
                           config_file: str | Path | None = None, lm=None) -> ResolvedConfig:
    """The checked ProfileConfig for a model on `device`.

    overrides: ProfileConfig fields the caller sets (flags); None leaves a field to the layers below, and so does
    a batch_tokens of 0. read_file: take unset thresholds from `sift.toml` (`--config`, $SIFT_CONFIG,
    ./sift.toml); lm: the model being profiled, to warn when the file was calibrated for other weights."""
    values: dict[str, Any] = asdict(device_defaults(device))
    source, warning = "built-in defaults", None
    if read_file:
        found = profile_defaults(config_file, lm)
        values.update({k: found[k] for k in THRESHOLDS})
        source, warning = found["source"], found["warning"]
    for key, value in (overrides or {}).items():
        if value is None or (key == "batch_tokens" and not value):
            continue
        values[key] = value
    cfg = ProfileConfig(**values)
    cfg.check()
    return ResolvedConfig(cfg, source, warning)
