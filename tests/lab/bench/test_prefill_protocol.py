"""`bench prefill`'s graphed protocol on a CPU: with the graph captures stood in for by eager runs (no CUDA here),
full recompute and no-attention are both timed from "replays", the no-attention graph is captured with attention
stood in, CacheBlend is left out with a reason, and every row states the protocol its baseline was timed in."""

import pytest
import torch

from sift_cli.lab.bench import prefill_case_run as pcr
from sift_cli.lab.bench.prefill import protocol, run_case
from sift_cli.lab.bench.prefill_cases import CPU_SMOKE_LLAMA, llama_cases
from sift_cli.lab.bench.prefill_timing import NOATTN
from sift_cli.prefill.run import sparse_prefill


class _FakeGraph:
    """A 'captured' dense forward: remembers the attention in force at capture, replays it eagerly."""

    made: list = []

    def __init__(self, lm, ids):
        self.attention = lm.model.config._attn_implementation
        self.capture_ms, self.replays = 0.0, 0
        self._run = lambda: lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        if self.attention == NOATTN:  # what the stand-in does, inside the "graph"
            from sift_cli.lab.bench.prefill_timing import stand_in

            run = self._run
            self._run = lambda: _with(stand_in(lm.model, NOATTN), run)
        _FakeGraph.made.append(self)

    def replay(self):
        self.replays += 1
        return self._run()


def _with(ctx, fn):
    with ctx:
        return fn()


class _FakeSparseGraph:
    def __init__(self, lm, prompt, backend, ids, opts, decoder, repeat):
        self._run = lambda: sparse_prefill(lm, prompt, backend, ids, opts, decoder)
        self.plan = self._run().plan
        self.lookup_ms = self.transfer_ms = self.capture_ms = 0.0

    def replay(self):
        return self._run()


def test_graphed_rows_time_every_baseline_from_replays(monkeypatch):
    _FakeGraph.made = []
    monkeypatch.setattr(pcr, "GraphedPrefill", _FakeGraph)
    monkeypatch.setattr(pcr, "graphed_sparse_prefill", _FakeSparseGraph)
    case = next(iter(llama_cases([320], "paper", 128, 64, None, "cpu", CPU_SMOKE_LLAMA)))
    with torch.inference_mode():
        rows = run_case(case, backends=("gather",), repeat=2, warmup=1, energy=False, cuda_graphs=True,
                        log=lambda *a: None)
    modes = {r["mode"]: r for r in rows}
    assert {"full", "no-attention", "sift-gather", "cacheblend"} <= set(modes)
    assert "not in the graphed protocol" in modes["cacheblend"]["error"]
    for r in rows:
        assert r["protocol"] == "graphed", r
        if "error" not in r:
            assert r["baseline_protocol"] == "graphed", r
    full, noattn = _FakeGraph.made
    assert full.attention != NOATTN and noattn.attention == NOATTN
    assert full.replays >= 3 and noattn.replays >= 3  # warm-up and timed runs both from the graphs
    sift = modes["sift-gather"]
    assert sift["ideal_ms"] <= sift["ideal_computed_ms"]
    assert protocol(True)["timing"] == "graphed" and protocol(False)["timing"] == "eager"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_protocol_on_a_gpu():
    """The real captures on a tiny 8B-shaped model: every row graphed, its baselines too; the eager run beside it
    the same in eager."""
    for graphed in (True, False):
        # head_dim 64, which the cuda kernel has: auto takes it on a Hopper GPU, as the graphed benches run
        tiny = {**CPU_SMOKE_LLAMA, "hidden_size": 256, "intermediate_size": 512, "head_dim": 64}
        case = next(iter(llama_cases([1024], "paper", 256, 64, None, "cuda", tiny)))
        with torch.inference_mode():
            rows = run_case(case, backends=("auto",), repeat=2, warmup=1, energy=False, cuda_graphs=graphed,
                            log=lambda *a: None)
        want = "graphed" if graphed else "eager"
        ok = [r for r in rows if "error" not in r]
        failed = [(r["mode"], r["error"]) for r in rows if "error" in r]
        assert {r["mode"] for r in ok} >= {"full", "no-attention"} and any(r["mode"].startswith("sift") for r in ok), \
            failed
        for r in ok:
            assert r["protocol"] == want and r["baseline_protocol"] == want, r
