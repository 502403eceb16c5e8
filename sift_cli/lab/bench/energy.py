"""GPU energy from NVML (GPU only): power sampled every `interval` in a thread while a prefill is repeated for at
least a second; E is joules per prefill; tokens/J = L / E; EDP = E·t; ED²P = E·t². pynvml is optional: without
it the meter says why and measures nothing.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from ...prefill.run import sync_device


class EnergyMeter:
    """GPU power from NVML sampled in a thread; joules by trapezoidal integration (and the board's energy counter
    where the GPU has one, as a cross-check)."""

    def __init__(self, device_index: int = 0, interval_s: float = 0.005):
        self.interval = interval_s
        self.reason = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(device_index))
        except Exception as exc:  # ImportError, NVMLError
            self.nvml = None
            self.reason = f"NVML unavailable ({type(exc).__name__}: {exc}); pip install nvidia-ml-py"

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def _counter_mj(self):
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception:
            return None

    def measure(self, fn, device, min_seconds: float = 1.0, min_runs: int = 2) -> dict:
        """Run fn repeatedly (synchronised) for >= min_seconds while sampling; per-run energy."""
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    samples.append((time.perf_counter(), self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3))
                except Exception:
                    pass
                time.sleep(self.interval)

        sync_device(device)
        th = threading.Thread(target=sample, daemon=True)
        c0 = self._counter_mj()
        th.start()
        time.sleep(3 * self.interval)
        t0 = time.perf_counter()
        runs = 0
        while runs < min_runs or time.perf_counter() - t0 < min_seconds:
            fn()
            sync_device(device)
            runs += 1
        t1 = time.perf_counter()
        c1 = self._counter_mj()
        stop.set()
        th.join()
        window = [(t, w) for t, w in samples if t0 <= t <= t1]
        if len(window) < 2:
            window = samples
        joules = sum((w0 + w1) / 2 * (t1_ - t0_) for (t0_, w0), (t1_, w1) in zip(window, window[1:])) \
            if len(window) > 1 else None
        if joules is not None and window:
            joules *= (t1 - t0) / max(1e-9, window[-1][0] - window[0][0])  # cover the edges of the window
        out = {"runs": runs, "seconds": t1 - t0, "samples": len(window),
               "avg_watts": float(np.mean([w for _, w in window])) if window else None,
               "joules_per_run": joules / runs if joules is not None else None,
               "counter_joules_per_run": (c1 - c0) / 1e3 / runs if c0 is not None and c1 is not None else None}
        return out


def _nvml_index(cuda_index: int) -> int:
    """NVML counts every GPU of the host; CUDA only the visible ones, in CUDA_VISIBLE_DEVICES order."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index


def energy_metrics(ttft_ms: float, joules: float | None, tokens: int) -> dict:
    if joules is None:
        return {"energy_j": None, "tokens_per_j": None, "edp": None, "ed2p": None}
    t = ttft_ms / 1e3
    return {"energy_j": joules, "tokens_per_j": tokens / joules, "edp": joules * t, "ed2p": joules * t * t}
