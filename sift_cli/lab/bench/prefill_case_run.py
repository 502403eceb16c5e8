"""One prompt length of `sift bench prefill`, every mode (`CaseRun`): full recompute and the time without
attention, SIFT per backend and query block size, CacheBlend; the rows, with energy where NVML answers.

One protocol per run (`protocol`): "eager" (every mode's forward launched eagerly) or "graphed" (every mode captured
once as a CUDA graph and its replays timed). Full recompute and no-attention are timed in the same protocol,
interleaved run by run; each SIFT mode right after, warm; energy from the same callable as the time. CacheBlend
streams its KV from host memory on a side stream and is not captured: a graphed run leaves it out (an error row
that says so) rather than compare it with a graphed baseline. Each row carries its `protocol` and the protocol its
baseline (full, no-attention) was timed in (`baseline_protocol`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from ...attention.backends import get_backend
from ...attention.reference import BAND_ROWS, ReferenceBackend
from ...block_lists import allowed_cells, computed_cells, mean_densities
from ...errors import SiftError, error_line
from ...model_features import features_of
from ...prefill.graphs import GraphedPrefill, graphed_sparse_prefill
from ...prefill.options import PrefillOptions, for_prompt
from ...prefill.plan import choose_decoder
from ...prefill.run import sparse_prefill, sync_device
from ...timing import timing_protocol
from ..eval.kvreuse import blend_forward, inv_freq_of, is_llama_family
from .energy import EnergyMeter, energy_metrics
from .host_kv import HostKV
from .prefill_cases import Case
from .prefill_timing import DENSE_EXPANDED, NOATTN, device_name, interleaved, sdpa_pin, stand_in, timed


@dataclass
class CaseRun:
    """One prompt length, every mode: the rows, and what later modes take from the full recompute."""

    case: Case
    repeat: int
    warmup: int
    energy: bool
    block_m: int | None  # query block rows; None: the backend's
    block_n: int
    ratio: float
    ssd_gbps: float
    log: object
    cuda_graphs: bool = False
    query_blocks: str = "auto"
    rows: list = field(default_factory=list)
    full: float = 0.0  # TTFT of full recompute, ms
    rest: float = 0.0  # TTFT without attention, ms
    baseline_protocol: str | None = None  # the protocol full and rest were timed in

    def __post_init__(self):
        lm = self.case.lm
        self.model, self.dev = lm.model, lm.device
        self.L = len(self.case.input_ids)
        self.ids = torch.tensor([self.case.input_ids], device=self.dev)
        self.meter = EnergyMeter(self.dev.index or 0) if (self.energy and self.dev.type == "cuda") else None
        docs = self.case.bits.layout.docs
        self.base = {"model": self.case.label, "pattern": self.case.pattern, "tokens": self.L,
                     "device": device_name(self.dev), "dtype": str(lm.dtype).replace("torch.", ""), "docs": len(docs),
                     "doc_tokens": max((d.n_tokens for d in docs), default=0), "tile": self.case.bits.tile,
                     "protocol": self.protocol}

    @property
    def protocol(self) -> str:
        return "graphed" if self.cuda_graphs else "eager"

    def speedup(self, ttft: float) -> float | None:
        """Full recompute's TTFT over `ttft`, withheld (None) when the runs do not meet the timing rule
        (`timing.timing_protocol`)."""
        if not ttft or timing_protocol(self.repeat, self.warmup)["speedup_withheld"]:
            return None
        return self.full / ttft

    @property
    def attn_full(self) -> float:
        return max(0.0, self.full - self.rest)

    def forward(self):
        return self.model(input_ids=self.ids, use_cache=True, logits_to_keep=1)

    def add_energy(self, row: dict, fn) -> None:
        if self.meter is None:
            row["energy_note"] = "GPU needed" if self.dev.type != "cuda" else (None if self.meter else "disabled")
            return
        if not self.meter.available:
            row["energy_note"] = self.meter.reason
            return
        e = self.meter.measure(fn, self.dev)
        row.update(energy_metrics(row["ttft_ms"], e["joules_per_run"], self.L))
        row["energy"] = e

    def error_row(self, mode: str, exc: Exception) -> None:
        self.rows.append({**self.base, "mode": mode, "error": error_line(exc, 200)})
        self.log(f"  {self.L:>6} {mode} failed: {self.rows[-1]['error']}")
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()

    def full_recompute(self, dense_kernel: str) -> None:
        """`full` (cuDNN SDPA, or the first fallback that runs) and `no-attention`."""
        dev, L = self.dev, self.L
        kernel = dense_kernel if dev.type == "cuda" else "default"
        impl = None
        for attempt in ((kernel, None), (kernel, DENSE_EXPANDED), ("default", None)):
            try:
                with sdpa_pin(dev, attempt[0]), stand_in(self.model, attempt[1]):
                    self.forward()
                    sync_device(dev)
                kernel, impl = attempt
                break
            except RuntimeError as exc:
                self.log(f"  dense SDPA with {attempt}: {error_line(exc, 120)}")
                torch.cuda.empty_cache() if dev.type == "cuda" else None

        def dense():
            with sdpa_pin(dev, kernel), stand_in(self.model, impl):
                return self.forward()

        capture_ms = None
        if self.cuda_graphs:  # both captured, both replayed
            with sdpa_pin(dev, kernel), stand_in(self.model, impl):
                graph = GraphedPrefill(self.case.lm, self.ids)
            with stand_in(self.model, NOATTN):
                rest_graph = GraphedPrefill(self.case.lm, self.ids)
            capture_ms = graph.capture_ms
            run_full, run_rest = graph.replay, rest_graph.replay
        else:
            graph = rest_graph = None
            run_full = dense

            def run_rest():
                with stand_in(self.model, NOATTN):
                    return self.forward()

        runs = interleaved({"full": run_full, "no-attention": run_rest}, dev, self.repeat, self.warmup)
        full_runs, rest_runs = runs["full"], runs["no-attention"]
        self.full, self.rest = statistics.median(full_runs), statistics.median(rest_runs)
        self.baseline_protocol = self.protocol
        row = {**self.base, "mode": "full", "ttft_ms": self.full, "runs_ms": full_runs,
               "dense_kernel": f"sdpa-{kernel}" + (" (K/V expanded)" if impl else ""), "cuda_graphs": self.cuda_graphs,
               "capture_ms": capture_ms, "baseline_protocol": self.baseline_protocol,
               "attention_ms": self.attn_full, "other_ms": self.rest,
               "attention_share": self.attn_full / self.full if self.full else None}
        self.add_energy(row, run_full)
        self.rows.append(row)
        self.rows.append({**self.base, "mode": "no-attention", "ttft_ms": self.rest, "runs_ms": rest_runs,
                          "cuda_graphs": self.cuda_graphs, "baseline_protocol": self.baseline_protocol})
        del graph, rest_graph
        self.log(f"  {L:>6} full        {self.full:9.1f} ms  ({row['dense_kernel']}, {self.protocol})")
        self.log(f"  {L:>6} no-attention {self.rest:8.1f} ms  → attention {self.attn_full:.1f} ms "
                 f"({100 * self.attn_full / self.full:.0f}%)")

    def sift(self, bname: str, block_m: int | None = None, label: str = "") -> None:
        """`sift-<backend><label>`: transfer, decode and the sparse forward, medians of `repeat` runs, with query
        blocks of `block_m` rows (default: the run's)."""
        lm, dev, prompt = self.case.lm, self.dev, self.case.prompt()
        block_m = block_m or self.block_m
        try:
            backend = get_backend(bname, dev, features_of(self.model))
        except SiftError as exc:
            self.rows.append({**self.base, "mode": f"sift-{bname}{label}", "error": str(exc)})
            return
        if backend.name == "reference" and dev.type == "cpu":
            backend = ReferenceBackend(rows=BAND_ROWS)
        decoder = choose_decoder(dev)
        opts = for_prompt(PrefillOptions(block_m=block_m, block_n=self.block_n, query_blocks=self.query_blocks),
                          backend, lm.head_dim, prompt.bits)
        if self.cuda_graphs:
            ttft, runs_ms, (lookup, transfer), decode, fwd, block_lists, capture_ms, run = self._sift_graphed(
                prompt, backend, opts, decoder)
        else:
            def run():
                return sparse_prefill(lm, prompt, backend, self.ids, opts, decoder)

            runs = []
            for i in range(self.warmup + self.repeat):
                r = run()
                r.past = None  # the KV cache (GBs at 64K) is not needed for timing
                if i >= self.warmup:
                    runs.append(r)
            med = statistics.median
            ttft, runs_ms = med(r.ttft_ms for r in runs), [r.ttft_ms for r in runs]
            transfer, decode = med(r.transfer_ms for r in runs), med(r.prepare_ms for r in runs)
            lookup = med(r.lookup_ms for r in runs)
            fwd, block_lists, capture_ms = med(r.forward_ms for r in runs), runs[-1].plan.block_lists, None
            del runs
        counted = [computed_cells(b) for b in block_lists]  # each layer's computed cells, counted once
        cells, blocks = mean_densities(block_lists, counted)
        allowed = self._allowed_density(block_lists)
        ideal = self.full - (1 - allowed) * self.attn_full  # a perfect kernel on the cells the bits select
        ideal_computed = self.full - (1 - cells) * self.attn_full  # ... on the cells our blocks compute
        mode = f"sift-{backend.name}{label}"
        row = {**self.base, "mode": mode, "ttft_ms": ttft, "runs_ms": runs_ms,
               "lookup_ms": lookup if prompt.source is not None else None, "transfer_ms": transfer,
               "decode_ms": decode, "forward_ms": fwd,
               "attention_ms": None if fwd is None else max(0.0, fwd - self.rest), "other_ms": self.rest,
               "cell_density": cells, "allowed_density": allowed, "block_density": blocks,
               "cells_over_allowed": cells / allowed if allowed else None,
               "query_blocks": opts.query_blocks, "block_m": opts.block_m, "block_n": self.block_n,
               "metadata_bytes": self.case.bits.nbytes(),
               "ideal_ms": ideal, "ttft_over_ideal": ttft / ideal if ideal > 0 else None,
               "ideal_computed_ms": ideal_computed,
               "ttft_over_ideal_computed": ttft / ideal_computed if ideal_computed > 0 else None,
               "speedup": self.speedup(ttft), "decoder": decoder,
               "cuda_graphs": self.cuda_graphs, "capture_ms": capture_ms, "baseline_protocol": self.baseline_protocol}
        del block_lists
        self.add_energy(row, run)
        self.rows.append(row)
        speed = "" if row["speedup"] is None else f"×{row['speedup']:.2f}"
        self.log(f"  {self.L:>6} {mode:<12}{ttft:9.1f} ms  {speed:>6}  density {cells:.3f}  "
                 f"cells/allowed {row['cells_over_allowed']:.3f}  ideal {ideal:.1f} ms (computed cells "
                 f"{ideal_computed:.1f} ms)"
                 + (f"  decode {decode:.1f} ms" if decode is not None else ""))

    def _allowed_density(self, block_lists) -> float:
        """Pairs the bits allow (SPEC §6's token rule) over all causal pairs, across heads and layers."""
        bits = self.case.bits.to(block_lists[0].offsets.device)
        allowed = sum(allowed_cells(bits, layer) for layer in range(len(block_lists)))
        return allowed / max(1.0, len(block_lists) * block_lists[0].n_heads * self.L * (self.L + 1) / 2)

    def _sift_graphed(self, prompt, backend, opts, decoder):
        """SIFT captured once (the copy of the ids and bits, decode and forward), then replayed; each replay's time
        includes looking the bits up (corpus cases) and staging them into pinned memory, which `lookup` and
        `transfer` report alone."""
        lm, dev = self.case.lm, self.dev
        graph = graphed_sparse_prefill(lm, prompt, backend, self.ids, opts, decoder, self.repeat)
        runs_ms = timed(graph.replay, dev, self.repeat, self.warmup)
        block_lists = graph.plan.block_lists
        return (statistics.median(runs_ms), runs_ms, (graph.lookup_ms, graph.transfer_ms), None, None, block_lists,
                graph.capture_ms, graph.replay)

    def cacheblend(self, host_kv: HostKV | None) -> None:
        """`cacheblend`: reused KV streamed per layer; compute-only and SSD-modelled times beside it."""
        model, dev = self.model, self.dev
        if self.cuda_graphs:
            self.rows.append({**self.base, "mode": "cacheblend", "error": "not in the graphed protocol (its KV is "
                              "streamed from host memory on a side stream, not captured): run without --cuda-graphs"})
            return
        if not is_llama_family(model):
            self.rows.append({**self.base, "mode": "cacheblend", "error": "needs a Llama-family model"})
            return
        n_ctx = self.case.bits.layout.docs_end
        suffix = self.L - n_ctx
        cfg = model.config
        kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        hk = host_kv or HostKV(cfg.num_hidden_layers, n_ctx, kv_heads, hd, self.case.lm.dtype, pin=dev.type == "cuda")
        inv = inv_freq_of(model)
        ids1 = self.ids[0]
        cuda = dev.type == "cuda"
        mask = "bottom-right" if cuda else "causal"

        def blend(streaming=True, events=None):
            load = hk.loader(n_ctx, dev, inv, streaming=streaming and cuda)
            return blend_forward(model, ids1, load, suffix, self.ratio, 1, mask, keep_kv=False, layer_events=events)

        runs = timed(blend, dev, self.repeat, self.warmup)
        ttft = statistics.median(runs)
        resident = hk.loader(n_ctx, dev, inv, streaming=False)
        comp_runs = timed(lambda: blend_forward(model, ids1, resident, suffix, self.ratio, 1, mask, keep_kv=False),
                          dev, self.repeat, 1)
        compute = statistics.median(comp_runs)
        per_layer = _layer_times(model, ids1, resident, suffix, self.ratio, mask, dev) if cuda else None
        resident = None  # the resident copy of the KV is not needed any more
        layer_bytes = hk.bytes_per_layer(n_ctx)
        ssd = _ssd_model_ms(per_layer, hk.first, layer_bytes / (self.ssd_gbps * 1e9) * 1e3)
        row = {**self.base, "mode": "cacheblend", "ttft_ms": ttft, "runs_ms": runs, "compute_ms": compute,
               "kv_bytes": layer_bytes * (cfg.num_hidden_layers - hk.first),
               "kv_source": "pinned host DRAM, streamed per layer" if cuda else "CPU memory",
               "ssd_gbps": self.ssd_gbps, "ssd_model_ms": ssd, "recompute_ratio": self.ratio, "mask": mask,
               "speedup": self.speedup(ttft), "cuda_graphs": False,
               "baseline_protocol": self.baseline_protocol}
        self.add_energy(row, blend)
        self.rows.append(row)
        self.log(f"  {self.L:>6} cacheblend  {ttft:9.1f} ms  (compute {compute:.1f} ms"
                 + (f", SSD-modelled {ssd:.1f} ms" if ssd else "") + ")")


def _layer_times(model, ids, load_kv, suffix, ratio, mask, dev) -> list[float]:
    """GPU ms of each layer of one blended forward (CUDA events)."""
    start = torch.cuda.Event(enable_timing=True)
    events: list = []
    start.record()
    blend_forward(model, ids, load_kv, suffix, ratio, 1, mask, keep_kv=False, layer_events=events)
    torch.cuda.synchronize(dev)
    marks = [start] + events
    return [marks[i].elapsed_time(marks[i + 1]) for i in range(len(events))]


def _ssd_model_ms(per_layer: list[float] | None, first: int, disk_ms: float) -> float | None:
    """Layer i computes while layer i + 1 loads from disk; layers before the check layer load nothing."""
    if not per_layer:
        return None
    loads = [0.0] * first + [disk_ms] * (len(per_layer) - first)
    return loads[0] + sum(max(c, loads[i + 1] if i + 1 < len(loads) else 0.0) for i, c in enumerate(per_layer))
