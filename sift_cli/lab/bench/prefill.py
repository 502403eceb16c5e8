"""`sift bench prefill` (paper Figs. 3, 14, 15 and Table 2): TTFT of full recompute, SIFT and CacheBlend, split
into attention / projections+MLP / metadata decode / metadata transfer, with GPU energy from NVML. The prompts and
their bits: `prefill_cases.py`; the energy meter: `energy.py`; CacheBlend's streamed KV: `host_kv.py`.

Modes and their split
- `full`: the model's own forward, SDPA pinned to cuDNN (falls back, and says so, when cuDNN refuses);
- `no-attention`: the same forward with attention replaced by a free identity — the projections+MLP time
  (everything but attention); `attention_ms = TTFT − no-attention` for the other modes;
- `sift-<backend>`: metadata transfer (bit vectors host→GPU), decode (bits → CSR lists over the prompt's
  document-aligned block table, plus the backend's own preparation), and the forward with block-sparse
  attention. `ideal_ms` is the full TTFT minus the skipped share (1 − cell density) of full attention time;
  `cells_over_allowed` is SPEC §6's fidelity measure (causal pairs computed over pairs the bits allow);
- with `cuda_graphs`, `full` and `sift-<backend>` are each captured once per prompt (SIFT's decode included) and
  their replays timed; the capture is reported apart (`capture_ms`);
- `cacheblend`: the blended forward of `eval.kvreuse` (layer 0 full, ~15% of tokens from layer 1 on; the released
  code's bottom-right mask, which is what its fast kernel computes), reused KV streamed per layer from pinned host
  memory on a side stream (pipelined, as CacheBlend loads layer l+1 while computing layer l); `compute_ms` is the
  same forward with the KV already on the GPU; `ssd_model_ms` adds a *modelled* disk read per layer at
  `ssd_gbps` (paper: 3.8 GB/s effective), overlapped with compute.
"""

from __future__ import annotations

import contextlib
import gc
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...attention.backends import get_backend
from ...attention.reference import BAND_ROWS, ReferenceBackend
from ...attention.swap import swapped_attention
from ...block_lists import cells_over_allowed, computed_cells, mean_densities
from ...errors import SiftError, error_line
from ...models import load_model
from ...prefill import (GraphedPrefill, PrefillOptions, choose_decoder, for_backend, graphed_sparse_prefill,
                        prompt_table, sparse_prefill, sync_device)
from ..eval.kvreuse import blend_forward, inv_freq_of, is_llama_family
from .energy import EnergyMeter, energy_metrics
from .host_kv import HostKV
from .prefill_cases import CPU_SMOKE_LLAMA, Case, essay_token_docs, llama_cases, real_profiles, smol_cases

LENGTHS = (8192, 16384, 32768, 65536)
NOATTN = "sift_bench_noattn"
DENSE_EXPANDED = "sift_bench_dense_kv_expanded"


# ---- attention stand-ins ---------------------------------------------------------------------------------------

def _noattn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    return query.transpose(1, 2), None  # [B, L, H, D]: free, same shape as attention's output


def _dense_expanded(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=query.shape[2] > 1, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


_STAND_INS = {NOATTN: _noattn, DENSE_EXPANDED: _dense_expanded}


def _stand_in(model, name: str | None):
    """The model's attention replaced by the stand-in `name` inside the block (None: left as it is)."""
    return swapped_attention(model, name, _STAND_INS[name]) if name else contextlib.nullcontext()


def _sdpa_pin(device, kernel: str):
    if torch.device(device).type != "cuda" or kernel == "default":
        return contextlib.nullcontext()
    return sdpa_kernel([{"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[kernel]])


# ---- timing ----------------------------------------------------------------------------------------------------

def timed(fn, device, repeat: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    sync_device(device)
    out = []
    for _ in range(repeat):
        sync_device(device)
        t0 = time.perf_counter()
        fn()
        sync_device(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _device_name(dev) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# ---- one case --------------------------------------------------------------------------------------------------

@dataclass
class _CaseRun:
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
    query_blocks: str = "segment"
    rows: list = field(default_factory=list)
    full: float = 0.0  # TTFT of full recompute, ms
    rest: float = 0.0  # TTFT without attention, ms

    def __post_init__(self):
        lm = self.case.lm
        self.model, self.dev = lm.model, lm.device
        self.L = len(self.case.input_ids)
        self.ids = torch.tensor([self.case.input_ids], device=self.dev)
        self.meter = EnergyMeter(self.dev.index or 0) if (self.energy and self.dev.type == "cuda") else None
        docs = self.case.bits.layout.docs
        self.base = {"model": self.case.label, "pattern": self.case.pattern, "tokens": self.L,
                     "device": _device_name(self.dev), "dtype": str(lm.dtype).replace("torch.", ""), "docs": len(docs),
                     "doc_tokens": max((d.n_tokens for d in docs), default=0), "tile": self.case.bits.tile}

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
                with _sdpa_pin(dev, attempt[0]), _stand_in(self.model, attempt[1]):
                    self.forward()
                    sync_device(dev)
                kernel, impl = attempt
                break
            except RuntimeError as exc:
                self.log(f"  dense SDPA with {attempt}: {error_line(exc, 120)}")
                torch.cuda.empty_cache() if dev.type == "cuda" else None

        def dense():
            with _sdpa_pin(dev, kernel), _stand_in(self.model, impl):
                return self.forward()

        capture_ms = None
        if self.cuda_graphs:
            with _sdpa_pin(dev, kernel), _stand_in(self.model, impl):
                graph = GraphedPrefill(self.case.lm, self.ids)
            capture_ms = graph.capture_ms
            full_runs = timed(graph.replay, dev, self.repeat, max(0, self.warmup - 1))
            del graph
        else:
            full_runs = timed(dense, dev, self.repeat, max(0, self.warmup - 1))
        self.full = statistics.median(full_runs)
        row = {**self.base, "mode": "full", "ttft_ms": self.full, "runs_ms": full_runs,
               "dense_kernel": f"sdpa-{kernel}" + (" (K/V expanded)" if impl else ""), "cuda_graphs": self.cuda_graphs,
               "capture_ms": capture_ms}
        self.add_energy(row, dense)
        self.rows.append(row)
        self.log(f"  {L:>6} full        {self.full:9.1f} ms  ({row['dense_kernel']})")
        with _stand_in(self.model, NOATTN):
            rest_runs = timed(self.forward, dev, self.repeat, self.warmup)
        self.rest = statistics.median(rest_runs)
        self.rows.append({**self.base, "mode": "no-attention", "ttft_ms": self.rest, "runs_ms": rest_runs})
        row.update(attention_ms=self.attn_full, other_ms=self.rest,
                   attention_share=self.attn_full / self.full if self.full else None)
        self.log(f"  {L:>6} no-attention {self.rest:8.1f} ms  → attention {self.attn_full:.1f} ms "
                 f"({100 * self.attn_full / self.full:.0f}%)")

    def sift(self, bname: str, block_m: int | None = None, label: str = "") -> None:
        """`sift-<backend><label>`: transfer, decode and the sparse forward, medians of `repeat` runs, with query
        blocks of `block_m` rows (default: the run's)."""
        lm, dev, prompt = self.case.lm, self.dev, self.case.prompt()
        block_m = block_m or self.block_m
        try:
            backend = get_backend(bname, dev)
        except SiftError as exc:
            self.rows.append({**self.base, "mode": f"sift-{bname}{label}", "error": str(exc)})
            return
        if backend.name == "reference" and dev.type == "cpu":
            backend = ReferenceBackend(rows=BAND_ROWS)
        decoder = choose_decoder(dev)
        opts = for_backend(PrefillOptions(block_m=block_m, block_n=self.block_n, query_blocks=self.query_blocks),
                           backend, lm.head_dim, self.L, prompt.bits.dense_share())
        if self.cuda_graphs:
            ttft, runs_ms, transfer, decode, fwd, block_lists, capture_ms, run = self._sift_graphed(
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
            fwd, block_lists, capture_ms = med(r.forward_ms for r in runs), runs[-1].plan.block_lists, None
            del runs
        counted = [computed_cells(b) for b in block_lists]  # each layer's computed cells, counted once
        cells, blocks = mean_densities(block_lists, counted)
        ideal = self.full - (1 - cells) * self.attn_full
        mode = f"sift-{backend.name}{label}"
        row = {**self.base, "mode": mode, "ttft_ms": ttft, "runs_ms": runs_ms,
               "transfer_ms": transfer, "decode_ms": decode, "forward_ms": fwd,
               "attention_ms": None if fwd is None else max(0.0, fwd - self.rest), "other_ms": self.rest,
               "cell_density": cells, "block_density": blocks,
               "cells_over_allowed": cells_over_allowed(self.case.bits.to(block_lists[0].offsets.device),
                                                        block_lists, counted),
               "query_blocks": self.query_blocks, "block_m": opts.block_m, "block_n": self.block_n,
               "metadata_bytes": self.case.bits.nbytes(),
               "ideal_ms": ideal, "ttft_over_ideal": ttft / ideal if ideal > 0 else None,
               "speedup": self.full / ttft if ttft else None, "decoder": decoder,
               "cuda_graphs": self.cuda_graphs, "capture_ms": capture_ms}
        del block_lists
        self.add_energy(row, run)
        self.rows.append(row)
        self.log(f"  {self.L:>6} {mode:<12}{ttft:9.1f} ms  ×{row['speedup']:.2f}  density {cells:.3f}  "
                 f"cells/allowed {row['cells_over_allowed']:.3f}  ideal {ideal:.1f} ms"
                 + (f"  decode {decode:.1f} ms" if decode is not None else ""))

    def _sift_graphed(self, prompt, backend, opts, decoder):
        """SIFT captured once (decode + forward), then replayed; TTFT adds the bits' transfer."""
        lm, dev = self.case.lm, self.dev
        bits, table, transfer = prompt_table(prompt, opts, dev, self.repeat)
        if prompt.bits.without_bits():
            transfer = 0.0  # SIFT replays full recompute's forward: nothing to move first
        graph = graphed_sparse_prefill(lm, prompt, backend, self.ids, opts, bits, table, decoder)
        runs_ms = [t + transfer for t in timed(graph.replay, dev, self.repeat, self.warmup)]
        block_lists = graph.plan.block_lists
        return (statistics.median(runs_ms), runs_ms, transfer, None, None, block_lists, graph.capture_ms,
                graph.replay)

    def cacheblend(self, host_kv: HostKV | None) -> None:
        """`cacheblend`: reused KV streamed per layer; compute-only and SSD-modelled times beside it."""
        model, dev = self.model, self.dev
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
               "speedup": self.full / ttft if ttft else None}
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


@torch.inference_mode()
def run_case(case: Case, modes=("full", "sift", "cacheblend"), backends=("auto",), repeat: int = 3,
             warmup: int = 1, energy: bool = True, block_ms=(None,), block_n: int = 64, ratio: float = 0.15,
             ssd_gbps: float = 3.8, host_kv: HostKV | None = None, dense_kernel: str = "cudnn",
             log=print, baseline: tuple[float, float] | None = None, cuda_graphs: bool = False,
             query_blocks: str = "segment") -> list[dict]:
    """Rows (one per mode) for one prompt length. block_ms: SIFT's query block rows (None: the backend's), one
    SIFT row per backend and size (labelled `@m<rows>` when there are several). baseline: (full ms, no-attention
    ms) measured earlier on the same model and length — full recompute is then not re-run."""
    run = _CaseRun(case, repeat, warmup, energy, block_ms[0], block_n, ratio, ssd_gbps, log, cuda_graphs=cuda_graphs,
                   query_blocks=query_blocks)
    if baseline is not None:
        run.full, run.rest = baseline
    else:
        run.full_recompute(dense_kernel)
    if "sift" in modes:
        for bname in backends:
            for bm in block_ms:
                label = f"@m{bm}" if len(block_ms) > 1 else ""
                try:
                    run.sift(bname, bm, label)
                except Exception as exc:  # one backend failing (e.g. out of memory) must not lose the rest
                    run.error_row(f"sift-{bname}{label}", exc)
    if "cacheblend" in modes:
        try:
            run.cacheblend(host_kv)
        except Exception as exc:
            run.error_row("cacheblend", exc)
    return run.rows


# ---- drivers ---------------------------------------------------------------------------------------------------

def require_gpu(cpu_smoke: bool) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if cpu_smoke:
        return torch.device("cpu")
    raise SiftError("bench prefill times GPU prefill: no CUDA GPU is visible here. Run it on a GPU machine; "
                    "--cpu-smoke runs a tiny functional pass whose timings mean nothing")


def summarize_rows(rows: list[dict]) -> list[dict]:
    """Compact table rows: per (model, pattern, tokens) the TTFT of each mode and SIFT's speed-up / ideal."""
    out = {}
    for r in rows:
        key = (r["model"], r["pattern"], r["tokens"])
        e = out.setdefault(key, {"model": r["model"], "pattern": r["pattern"], "tokens": r["tokens"]})
        if "error" in r:
            e[r["mode"]] = f"error: {r['error'][:60]}"
            continue
        e[r["mode"]] = round(r["ttft_ms"], 2)
        if r["mode"] == "full":
            e["attention_share"] = r.get("attention_share")
        if r["mode"].startswith("sift"):
            e[f"{r['mode']}_speedup"] = r.get("speedup")
            e[f"{r['mode']}_over_ideal"] = r.get("ttft_over_ideal")
            e["cell_density"] = r.get("cell_density")
            e["cells_over_allowed"] = r.get("cells_over_allowed")
    return list(out.values())


def _run_cases(cases, emit, out_of_time, log, host_kv_for=None, empty_cache: bool = False, **case_kw) -> None:
    """Every case of one model: skipped once the time budget is spent; a failing case is a row, not an end.
    host_kv_for(case): CacheBlend's reused KV for the case (None: made per case); empty_cache: free the GPU's
    cached blocks after each case."""
    for case in cases:
        if out_of_time():
            emit([{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids), "mode": "all",
                   "error": "skipped: time budget"}])
            continue
        host_kv = host_kv_for(case) if host_kv_for else None
        try:
            emit(run_case(case, host_kv=host_kv, log=log, **case_kw))
        except Exception as exc:  # one case failing must not lose the others
            emit([{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids), "mode": "all",
                   "error": error_line(exc, 200)}])
            log(f"  case {len(case.input_ids)} failed: {exc}")
        if empty_cache:
            torch.cuda.empty_cache()


def run_bench(models=("llama3-8b",), lengths=LENGTHS, pattern: str = "paper",
              doc_tokens: int | tuple[int, int] = (300, 3000), modes=("full", "sift", "cacheblend"), backends=("auto",),
              repeat: int = 3, warmup: int = 1, energy: bool = True, ratio: float = 0.15, ssd_gbps: float = 3.8,
              data=None, smol_model: str | None = None, cpu_smoke: bool = False, deadline: float | None = None,
              log=print, on_rows=None, cuda_graphs: bool = False, query_blocks: str = "segment",
              unprofiled: int = 0, block_ms=(None,)) -> list[dict]:
    """Every (model, length) case; rows of `run_case`. models: 'llama3-8b' (the 8B-shaped model with `pattern`
    bits) and/or 'smollm2' (real profiles; `smol_model` is a --model spec, default the bundled GGUF). unprofiled:
    documents per 8B-shaped prompt without bits (dense)."""
    device = require_gpu(cpu_smoke)
    rows: list[dict] = []
    case_kw = dict(modes=modes, backends=backends, repeat=repeat, warmup=warmup, energy=energy, ratio=ratio,
                   ssd_gbps=ssd_gbps, cuda_graphs=cuda_graphs, query_blocks=query_blocks, block_ms=tuple(block_ms))
    longest_doc = doc_tokens[1] if isinstance(doc_tokens, tuple) else doc_tokens

    def emit(new):
        rows.extend(new)
        if on_rows:
            on_rows(new)

    def out_of_time():
        return deadline is not None and time.perf_counter() > deadline

    smol = None

    def load_smol():
        nonlocal smol
        if smol is None:
            smol = load_model(smol_model, device=str(device))
        return smol

    sources = None
    for name in models:
        if name in ("llama3-8b", "llama"):
            if pattern == "sampled" and sources is None:
                sources = real_profiles(load_smol(), essay_token_docs(load_smol(), data, longest_doc, 16))[1]
            held: dict = {}

            def host_kv_for(case):  # one pinned buffer for every length of this model, made on first use
                if "cacheblend" in modes and "kv" not in held:
                    cfg = case.lm.model.config
                    held["kv"] = HostKV(cfg.num_hidden_layers, max(lengths), cfg.num_key_value_heads, cfg.head_dim,
                                        case.lm.dtype, pin=device.type == "cuda")
                return held.get("kv")

            cases = llama_cases(lengths, pattern, doc_tokens, 64, sources, str(device),
                                CPU_SMOKE_LLAMA if cpu_smoke else None, unprofiled=unprofiled)
            _run_cases(cases, emit, out_of_time, log, host_kv_for, device.type == "cuda", **case_kw)
            del cases, held
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        elif name in ("smollm2", "smol"):
            _run_cases(smol_cases(load_smol(), lengths, data, longest_doc), emit, out_of_time, log, **case_kw)
        else:
            raise SiftError(f"--models {name}: expected llama3-8b or smollm2")
    return rows


def bench_prefill(models: list[str], lengths: list[int], pattern: str = "paper",
                  doc_tokens: int | tuple[int, int] = (300, 3000), modes=("full", "sift", "cacheblend"),
                  backends=("auto",), repeat: int = 3, warmup: int = 1, energy: bool = True, ratio: float = 0.15,
                  ssd_gbps: float = 3.8, data=None, smol_model: str | None = None, cpu_smoke: bool = False,
                  log=print, cuda_graphs: bool = False, query_blocks: str = "segment", unprofiled: int = 0,
                  block_ms=(None,)) -> dict:
    """What `sift bench prefill` reports: {rows, summary, cpu_smoke}. cpu_smoke: without a GPU, a tiny functional
    pass (lengths capped at 512, at most two; 128-token documents)."""
    require_gpu(cpu_smoke)
    if cpu_smoke:
        lengths = [min(x, 512) for x in lengths][:2]
        doc_tokens = 128
    rows = run_bench(models, lengths, pattern, doc_tokens, tuple(modes), tuple(backends), repeat, warmup, energy,
                     ratio, ssd_gbps, data, smol_model, cpu_smoke, log=log, cuda_graphs=cuda_graphs,
                     query_blocks=query_blocks, unprofiled=unprofiled, block_ms=block_ms)
    return {"rows": rows, "summary": summarize_rows(rows), "cpu_smoke": cpu_smoke}
