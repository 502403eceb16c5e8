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
RULES = ("paper", "mass")  # how tiles and pages are chosen: thresholds α, β, γ, or a bound ε, ε' on dropped mass
MASS_DEFAULTS = {"epsilon": 0.02, "ca_epsilon": 0.05}


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
    rule: str = "paper"
    epsilon: float = MASS_DEFAULTS["epsilon"]  # mass rule: per query row, the most attention mass LA may drop
    ca_epsilon: float = MASS_DEFAULTS["ca_epsilon"]  # mass rule: per head, the largest share CA may drop

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
        if self.rule not in RULES:
            raise SiftError(f"--rule {self.rule}: expected one of {', '.join(RULES)}")
        for name in ("epsilon", "ca_epsilon"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise SiftError(f"--{name.replace('_', '-')} {v}: must be at least 0 and below 1")
        if self.rule == "mass" and self.stats == "triton":
            raise SiftError("--rule mass computes its statistics with --stats torch (the Triton kernels compute "
                            "the paper rule's)")

    def thresholds(self) -> dict:
        """The selection's parameters as reports and shard metadata name them (the paper rule's keys alone, as
        before the mass rule existed)."""
        if self.rule == "mass":
            return {"tile_size": self.tile, "rule": "mass", "epsilon": self.epsilon, "ca_epsilon": self.ca_epsilon}
        return {"tile_size": self.tile, "alpha": self.alpha, "beta": self.beta, "gamma": self.gamma}

    def rule_metadata(self) -> dict:
        """The `sift.*` keys of the rule: the paper rule writes α, β, γ (and no rule key: sets made before the
        mass rule are paper sets); the mass rule writes its name, ε and ε', and null thresholds."""
        if self.rule == "mass":
            return {"sift.alpha": None, "sift.beta": None, "sift.gamma": None, "sift.rule": "mass",
                    "sift.epsilon": self.epsilon, "sift.ca_epsilon": self.ca_epsilon}
        return {"sift.alpha": self.alpha, "sift.beta": self.beta, "sift.gamma": self.gamma}


def rule_of(meta: dict) -> dict:
    """ProfileConfig fields (tile, rule and its parameters) of a set from its `sift.*` metadata."""
    out = {"tile": int(meta["sift.tile_size"]), "rule": meta.get("sift.rule") or "paper"}
    if out["rule"] == "mass":
        out.update(epsilon=float(meta["sift.epsilon"]), ca_epsilon=float(meta["sift.ca_epsilon"]))
    else:
        out.update(alpha=float(meta["sift.alpha"]), beta=float(meta["sift.beta"]), gamma=float(meta["sift.gamma"]))
    return out


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
        out[key] = int(value) if key == "tile" else value if key == "rule" else float(value)
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


def check_rule_parameters(overrides: Mapping[str, Any]) -> None:
    """Refuse the parameters of one rule given with the other (they would be silently unused)."""
    mass = overrides.get("rule") == "mass"
    given = [k for k in (("alpha", "beta", "gamma") if mass else ("epsilon", "ca_epsilon"))
             if overrides.get(k) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise SiftError(f"{flag} belongs to --rule {'paper' if mass else 'mass'}, not --rule "
                        f"{'mass' if mass else overrides.get('rule') or 'paper'}")


def _check_flags_fit_the_files_rule(overrides: Mapping[str, Any], rule: str, source: str) -> None:
    """A paper-rule threshold flag under a config file that chose the mass rule would go unused: refuse it."""
    try:
        check_rule_parameters({**overrides, "rule": rule})
    except SiftError as exc:
        raise SiftError(f"{exc} ({source} sets rule = {rule}; add --rule paper to use the thresholds)") from None


def resolve_profile_config(device, overrides: Mapping[str, Any] | None = None, *, read_file: bool = False,
                           config_file: str | Path | None = None, lm=None) -> ResolvedConfig:
    """The checked ProfileConfig for a model on `device`.

    overrides: ProfileConfig fields the caller sets (flags); None leaves a field to the layers below, and so does
    a batch_tokens of 0. read_file: take unset thresholds from `sift.toml` (`--config`, $SIFT_CONFIG,
    ./sift.toml); lm: the model being profiled, to warn when the file was calibrated for other weights."""
    check_rule_parameters(overrides or {})
    values: dict[str, Any] = asdict(device_defaults(device))
    source, warning = "built-in defaults", None
    if read_file:
        found = profile_defaults(config_file, lm)
        values.update({k: found[k] for k in (*THRESHOLDS, "rule", *MASS_DEFAULTS) if k in found})
        source, warning = found["source"], found["warning"]
    for key, value in (overrides or {}).items():
        if value is None or (key == "batch_tokens" and not value):
            continue
        values[key] = value
    if (overrides or {}).get("rule") is None and values.get("rule", "paper") != "paper":
        _check_flags_fit_the_files_rule(overrides or {}, values["rule"], source)
    cfg = ProfileConfig(**values)
    cfg.check()
    return ResolvedConfig(cfg, source, warning)
