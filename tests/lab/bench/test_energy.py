"""Energy metrics, and the meter without NVML."""

import pytest


def test_energy_metrics_and_meter_without_nvml(monkeypatch):
    import sys

    from sift_cli.lab.bench.energy import EnergyMeter, energy_metrics

    e = energy_metrics(200.0, 50.0, 8192)
    assert e["tokens_per_j"] == pytest.approx(163.84) and e["edp"] == pytest.approx(10.0)
    assert e["ed2p"] == pytest.approx(2.0)
    assert energy_metrics(1.0, None, 1)["energy_j"] is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    m = EnergyMeter()
    assert not m.available and "NVML" in m.reason
