"""The profile configuration: sift.toml read and written, and flags over the file over the device defaults."""

import pytest

from sift_cli.config import (CPU_DEFAULTS, GPU_DEFAULTS, THRESHOLDS, ProfileConfig, device_defaults,
                             profile_defaults, resolve_profile_config)
from sift_cli.config_file import read_config, write_config
from sift_cli.errors import SiftError


def test_config_round_trip_and_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SIFT_CONFIG", raising=False)
    assert profile_defaults()["source"] == "built-in defaults"
    p = write_config(tmp_path / "sift.toml", {"tile": 32, "alpha": 0.003, "beta": 0.01, "gamma": 0.3},
                     {"model": 'my "model"', "weights": "sha256:abc", "density": 0.5}, "a comment\nline two")
    d = profile_defaults()  # ./sift.toml is found
    assert (d["tile"], d["alpha"], d["beta"], d["gamma"]) == (32, 0.003, 0.01, 0.3) and d["source"] == str(p)
    assert read_config(p)["calibration"]["model"] == 'my "model"'

    class LM:
        fingerprint = "sha256:other"

    assert "calibrated for weights" in profile_defaults(lm=LM())["warning"]
    other = write_config(tmp_path / "x" / "other.toml", dict(THRESHOLDS, tile=128), {})
    monkeypatch.setenv("SIFT_CONFIG", str(other))
    assert profile_defaults()["tile"] == 128
    assert profile_defaults(p)["tile"] == 32  # an explicit path wins
    bad = tmp_path / "bad.toml"
    bad.write_text("[profile]\ntile = 64\ndelta = 1\n")
    with pytest.raises(SiftError, match="unknown key"):
        profile_defaults(bad)
    with pytest.raises(SiftError, match="not found"):
        profile_defaults(tmp_path / "nope.toml")


def test_device_defaults_are_defined_once():
    assert device_defaults("cuda:1") is GPU_DEFAULTS and device_defaults("cpu") is CPU_DEFAULTS
    assert (GPU_DEFAULTS.batch_tokens, GPU_DEFAULTS.stats_budget_bytes) == (65536, 2 << 30)
    assert (CPU_DEFAULTS.batch_tokens, CPU_DEFAULTS.stats_budget_bytes) == (16384, 256 << 20)
    assert ProfileConfig().batch_tokens == CPU_DEFAULTS.batch_tokens


def test_flags_win_over_the_file_over_the_device_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SIFT_CONFIG", raising=False)
    r = resolve_profile_config("cuda", {"tile": None, "batch_tokens": 0})
    assert r.profile == ProfileConfig(batch_tokens=65536, stats_budget_bytes=2 << 30)
    assert r.source == "built-in defaults" and r.warning is None
    write_config(tmp_path / "sift.toml", dict(THRESHOLDS, tile=32, alpha=0.003), {"weights": "sha256:abc"})
    assert resolve_profile_config("cpu", {"alpha": 0.5}).profile.tile == 64  # the file is read only when asked
    class LM:
        fingerprint = "sha256:other"

    r = resolve_profile_config("cpu", {"alpha": 0.5, "batch_tokens": 99}, read_file=True, lm=LM())
    assert (r.profile.tile, r.profile.alpha, r.profile.batch_tokens) == (32, 0.5, 99)
    assert r.source.endswith("sift.toml") and "calibrated for weights" in r.warning
    with pytest.raises(SiftError, match="--tile 48"):
        resolve_profile_config("cpu", {"tile": 48})


def test_threshold_flags_under_a_file_of_the_mass_rule_are_refused(tmp_path, monkeypatch):
    """sift.toml chose the mass rule: --alpha alone would be silently unused, so it is refused with the remedy;
    with --rule paper it is used."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SIFT_CONFIG", raising=False)
    write_config(tmp_path / "sift.toml", {"tile": 64, "rule": "mass", "epsilon": 0.05, "ca_epsilon": 0.1}, {})
    assert resolve_profile_config("cpu", {}, read_file=True).profile.rule == "mass"
    with pytest.raises(SiftError, match=r"--alpha belongs to --rule paper.*sift.toml sets rule = mass.*--rule paper"):
        resolve_profile_config("cpu", {"alpha": 0.003}, read_file=True)
    r = resolve_profile_config("cpu", {"alpha": 0.003, "rule": "paper"}, read_file=True)
    assert (r.profile.rule, r.profile.alpha) == ("paper", 0.003)
