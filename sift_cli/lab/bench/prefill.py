"""`sift bench prefill` (paper Figs. 3, 14, 15 and Table 2): TTFT of full recompute, SIFT and CacheBlend, split
into attention / projections+MLP / metadata decode / metadata transfer, with GPU energy from NVML.

Models
- **SmolLM2** (the bundled model or any checkpoint) with *real* profiles: essays cut to `doc_tokens` tokens,
  profiled on the spot; past the model's trained context (8K) the numbers are speed only.
- **A Llama-3-8B-shaped model**: the published Llama-3.1-8B config (32 layers, 32 query / 8 KV heads,
  head_dim 128, 128K context) with random bf16 weights (speed does not depend on weight values), its tile
  patterns either drawn at the paper's densities (`pattern="paper"`: LA 27.3% of tiles, CA 5.8% of pages, the
  diagonal always set) or sampled per (document, layer, head) from real SmolLM2 profiles of documents of the
  same length (`pattern="sampled"`). Every row says which.

Modes and their split
- `full`: the model's own forward, SDPA pinned to cuDNN (falls back, and says so, when cuDNN refuses);
- `no-attention`: the same forward with attention replaced by a free identity — the projections+MLP time
  (everything but attention); `attention_ms = TTFT − no-attention` for the other modes;
- `sift-<backend>`: metadata transfer (bit vectors host→GPU), decode (bits → CSR lists, plus the backend's own
  preparation), and the forward with block-sparse attention. `ideal_ms` is the full TTFT minus the skipped share
  (1 − cell density) of full attention time;
- `cacheblend`: the blended forward of `eval.kvreuse` (layer 0 full, ~15% of tokens from layer 1 on; the released
  code's bottom-right mask, which is what its fast kernel computes), reused KV streamed per layer from pinned host
  memory on a side stream (pipelined, as CacheBlend loads layer l+1 while computing layer l); `compute_ms` is the
  same forward with the KV already on the GPU; `ssd_model_ms` adds a *modelled* disk read per layer at
  `ssd_gbps` (paper: 3.8 GB/s effective), overlapped with compute.

Energy (GPU only): NVML power sampled every `interval` in a thread while the mode's prefill is repeated for at
least a second; E is joules per prefill; tokens/J = L / E; EDP = E·t; ED²P = E·t².
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from ...attention.swap import swapped_attention
from ...errors import SiftError
from ...layout import PromptBits, PromptLayout
from .llama import LLAMA31_8B_CONFIG, LLAMA31_8B_NAME, random_llama

PAPER_LA_DENSITY = 1 - 0.727  # paper §3.2: chosen LA sparsity 72.7%
PAPER_CA_DENSITY = 1 - 0.942  # paper §3.4: chosen CA sparsity 94.2%
LENGTHS = (8192, 16384, 32768, 65536)
NOATTN = "sift_bench_noattn"
DENSE_EXPANDED = "sift_bench_dense_kv_expanded"


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ---- models ----------------------------------------------------------------------------------------------------

def llama3_8b_shaped(device="cuda", dtype=torch.bfloat16, overrides: dict | None = None, seed: int = 0):
    """Random-weight model with the published Llama-3.1-8B shapes, as a LoadedModel."""
    name = LLAMA31_8B_NAME if not overrides else f"Llama-shaped {overrides}"
    return random_llama({**LLAMA31_8B_CONFIG, **(overrides or {})}, device, dtype, seed, name)


# ---- prompts and bit patterns ----------------------------------------------------------------------------------

def synthetic_layout(total: int, doc_tokens: int, prefix_len: int = 16, suffix_len: int = 32) -> PromptLayout:
    """prefix ‖ docs of `doc_tokens` tokens (the last one shorter) ‖ suffix, exactly `total` tokens."""
    body = total - prefix_len - suffix_len
    if body < 1:
        raise SiftError(f"length {total} is too short for a prompt")
    lengths = [doc_tokens] * (body // doc_tokens)
    if body % doc_tokens:
        lengths.append(body % doc_tokens)
    return PromptLayout.build(prefix_len, [f"d{i}" for i in range(len(lengths))], lengths, suffix_len)


def paper_density_bits(layout: PromptLayout, n_layers: int, n_heads: int, tile: int = 64,
                       la_density: float = PAPER_LA_DENSITY, ca_density: float = PAPER_CA_DENSITY,
                       seed: int = 0) -> PromptBits:
    """Random bits at the paper's densities: the diagonal always set, other tiles with the probability that makes
    the expected LA tile density `la_density`; each page with probability `ca_density`."""
    from ...bits import n_pages, pack_doc

    rng = np.random.default_rng(seed)
    la_blobs, ca_blobs = [], []
    for d in layout.docs:
        p = n_pages(d.n_tokens, tile)
        total = p * (p + 1) / 2
        p_off = 0.0 if p == 1 else min(1.0, max(0.0, (la_density * total - p) / (total - p)))
        la = np.tril(rng.random((n_layers, n_heads, p, p)) < p_off)
        la[:, :, np.arange(p), np.arange(p)] = True
        ca = rng.random((n_layers, n_heads, p)) < ca_density
        a, c = pack_doc(la, ca)
        la_blobs.append(a)
        ca_blobs.append(c)
    return PromptBits.pack(layout, la_blobs, ca_blobs, tile, n_layers, n_heads)


def sampled_bits(layout: PromptLayout, n_layers: int, n_heads: int, sources: list, tile: int, seed: int = 0
                 ) -> PromptBits:
    """Per (document, layer, head), the (layer, head) pattern of a random source document of the same page count.

    sources: DocBits-like objects (la_tiles [L0, H0, P, P], ca_pages [L0, H0, P]) profiled at `tile`."""
    from ...bits import n_pages, pack_doc

    rng = np.random.default_rng(seed)
    by_pages: dict[int, list] = {}
    for s in sources:
        by_pages.setdefault(int(s.ca_pages.shape[-1]), []).append(s)
    la_blobs, ca_blobs = [], []
    for d in layout.docs:
        p = n_pages(d.n_tokens, tile)
        pool = by_pages.get(p)
        if not pool:  # a shorter last document: crop a longer source's top-left corner (its first p pages)
            longer = sorted(k for k in by_pages if k > p)
            if not longer:
                raise SiftError(f"no source profile with at least {p} pages")
            pool = [_Cropped(s, p) for s in by_pages[longer[0]]]
        la = np.zeros((n_layers, n_heads, p, p), dtype=bool)
        ca = np.zeros((n_layers, n_heads, p), dtype=bool)
        for layer in range(n_layers):
            for h in range(n_heads):
                s = pool[rng.integers(len(pool))]
                sl, sh = rng.integers(s.ca_pages.shape[0]), rng.integers(s.ca_pages.shape[1])
                la[layer, h] = s.la_tiles[sl, sh].numpy() if hasattr(s.la_tiles, "numpy") else s.la_tiles[sl, sh]
                ca[layer, h] = s.ca_pages[sl, sh].numpy() if hasattr(s.ca_pages, "numpy") else s.ca_pages[sl, sh]
        a, c = pack_doc(la, ca)
        la_blobs.append(a)
        ca_blobs.append(c)
    return PromptBits.pack(layout, la_blobs, ca_blobs, tile, n_layers, n_heads)


class _Cropped:
    def __init__(self, s, p):
        self.la_tiles = s.la_tiles[..., :p, :p]
        self.ca_pages = s.ca_pages[..., :p]


# ---- attention stand-ins ---------------------------------------------------------------------------------------

def _noattn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    return query.transpose(1, 2), None  # [B, L, H, D]: free, same shape as attention's output


def _dense_expanded(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    import torch.nn.functional as F

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
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([{"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[kernel]])


# ---- timing and energy -----------------------------------------------------------------------------------------

def timed(fn, device, repeat: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    out = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


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

        _sync(device)
        th = threading.Thread(target=sample, daemon=True)
        c0 = self._counter_mj()
        th.start()
        time.sleep(3 * self.interval)
        t0 = time.perf_counter()
        runs = 0
        while runs < min_runs or time.perf_counter() - t0 < min_seconds:
            fn()
            _sync(device)
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
    import os

    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index


def energy_metrics(ttft_ms: float, joules: float | None, tokens: int) -> dict:
    if joules is None:
        return {"energy_j": None, "tokens_per_j": None, "edp": None, "ed2p": None}
    t = ttft_ms / 1e3
    return {"energy_j": joules, "tokens_per_j": tokens / joules, "edp": joules * t, "ed2p": joules * t * t}


# ---- CacheBlend KV streaming -----------------------------------------------------------------------------------

class HostKV:
    """Reused KV of every layer from `first_layer` on, in pinned host memory, [S, H_kv, D] per tensor (so any
    prefix of positions is a contiguous slice), plus a per-layer loader that streams it to the GPU on a side
    stream one layer ahead and rotates the (pre-RoPE) keys to their positions, as CacheBlend's code does."""

    def __init__(self, n_layers: int, max_tokens: int, kv_heads: int, head_dim: int, dtype, first_layer: int = 1,
                 pin: bool = True, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.first = first_layer
        self.k, self.v = {}, {}
        draw = torch.randn(max_tokens, kv_heads, head_dim, generator=g).to(dtype)  # values do not matter for speed
        for layer in range(first_layer, n_layers):
            for store in (self.k, self.v):
                t = torch.empty(max_tokens, kv_heads, head_dim, dtype=dtype, pin_memory=pin)
                t.copy_(draw)
                store[layer] = t
        del draw

    def bytes_per_layer(self, n: int) -> int:
        t = self.k[self.first]
        return 2 * n * t.shape[1] * t.shape[2] * t.element_size()

    def loader(self, n: int, device, inv_freq, streaming: bool = True):
        pos = torch.arange(n, device=device)
        if not streaming:  # KV resident on the GPU already (compute-only timing)
            dev = {layer: (self.k[layer][:n].to(device), self.v[layer][:n].to(device)) for layer in self.k}
            from ..eval.kvreuse import rotate

            def resident(layer):
                k, v = dev[layer]
                return rotate(k.transpose(0, 1), pos, inv_freq), v.transpose(0, 1)

            return resident
        stream = torch.cuda.Stream(device)
        pending: dict[int, tuple] = {}

        def issue(layer):
            if layer in pending or layer not in self.k:
                return
            with torch.cuda.stream(stream):
                k = self.k[layer][:n].to(device, non_blocking=True)
                v = self.v[layer][:n].to(device, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
            pending[layer] = (k, v, ev)

        issue(self.first)

        def load(layer):
            from ..eval.kvreuse import rotate

            issue(layer)
            k, v, ev = pending.pop(layer)
            cur = torch.cuda.current_stream(device)
            cur.wait_event(ev)
            k.record_stream(cur)
            v.record_stream(cur)
            issue(layer + 1)
            return rotate(k.transpose(0, 1), pos, inv_freq), v.transpose(0, 1)

        return load


# ---- one case --------------------------------------------------------------------------------------------------

@dataclass
class Case:
    lm: object  # LoadedModel
    label: str  # model label
    pattern: str  # how the bits were made
    input_ids: list[int]
    bits: PromptBits


def _prompt(case: Case):
    from ...prompt import Prompt

    lay = case.bits.layout
    return Prompt(case.input_ids, lay, case.bits, [d.doc_id for d in lay.docs], "bench")


@torch.inference_mode()
def run_case(case: Case, modes=("full", "sift", "cacheblend"), backends=("auto",), repeat: int = 3,
             warmup: int = 1, energy: bool = True, block_m: int = 128, block_n: int = 64, ratio: float = 0.15,
             ssd_gbps: float = 3.8, host_kv: HostKV | None = None, dense_kernel: str = "cudnn",
             log=print, baseline: tuple[float, float] | None = None) -> list[dict]:
    """Rows (one per mode) for one prompt length. baseline: (full ms, no-attention ms) measured earlier on the
    same model and length — full recompute is then not re-run."""
    from ...attention import get_backend
    from ...block_lists import cell_density
    from ..eval.kvreuse import blend_forward, inv_freq_of
    from ...prefill import sparse_prefill

    lm = case.lm
    model, dev = lm.model, lm.device
    L = len(case.input_ids)
    ids = torch.tensor([case.input_ids], device=dev)
    meter = EnergyMeter(dev.index or 0) if (energy and dev.type == "cuda") else None
    base = {"model": case.label, "pattern": case.pattern, "tokens": L, "device": _device_name(dev),
            "dtype": str(lm.dtype).replace("torch.", ""), "docs": len(case.bits.layout.docs),
            "doc_tokens": max((d.n_tokens for d in case.bits.layout.docs), default=0), "tile": case.bits.tile}
    rows = []

    def forward():
        return model(input_ids=ids, use_cache=True, logits_to_keep=1)

    def add_energy(row, fn):
        if meter is None:
            row["energy_note"] = "GPU needed" if dev.type != "cuda" else (None if meter else "disabled")
            return
        if not meter.available:
            row["energy_note"] = meter.reason
            return
        e = meter.measure(fn, dev)
        row.update(energy_metrics(row["ttft_ms"], e["joules_per_run"], L))
        row["energy"] = e

    if baseline is not None:
        full, rest = baseline
        attn_full = max(0.0, full - rest)
    else:
        # full recompute
        kernel = dense_kernel if dev.type == "cuda" else "default"
        impl = None
        with torch.inference_mode():
            for attempt in ((kernel, None), (kernel, DENSE_EXPANDED), ("default", None)):
                try:
                    with _sdpa_pin(dev, attempt[0]), _stand_in(model, attempt[1]):
                        forward()
                        _sync(dev)
                    kernel, impl = attempt
                    break
                except RuntimeError as exc:
                    log(f"  dense SDPA with {attempt}: {str(exc).splitlines()[0][:120]}")
                    torch.cuda.empty_cache() if dev.type == "cuda" else None

            def dense():
                with _sdpa_pin(dev, kernel), _stand_in(model, impl):
                    forward()

            full_runs = timed(dense, dev, repeat, max(0, warmup - 1))
            full = statistics.median(full_runs)
            row = {**base, "mode": "full", "ttft_ms": full, "runs_ms": full_runs,
                   "dense_kernel": f"sdpa-{kernel}" + (" (K/V expanded)" if impl else "")}
            add_energy(row, dense)
            rows.append(row)
            log(f"  {L:>6} full        {full:9.1f} ms  ({row['dense_kernel']})")

            with _stand_in(model, NOATTN):
                rest_runs = timed(forward, dev, repeat, warmup)
            rest = statistics.median(rest_runs)
            rows.append({**base, "mode": "no-attention", "ttft_ms": rest, "runs_ms": rest_runs})
            attn_full = max(0.0, full - rest)
            row.update(attention_ms=attn_full, other_ms=rest, attention_share=attn_full / full if full else None)
            log(f"  {L:>6} no-attention {rest:8.1f} ms  → attention {attn_full:.1f} ms ({100 * attn_full / full:.0f}%)")

    if "sift" in modes:
        prompt = _prompt(case)

        def sift_mode(bname):
            try:
                backend = get_backend(bname, dev)
            except SiftError as exc:
                rows.append({**base, "mode": f"sift-{bname}", "error": str(exc)})
                return
            if backend.name == "reference" and dev.type == "cpu":
                from ...attention.reference import BAND_ROWS, ReferenceBackend

                backend = ReferenceBackend(rows=BAND_ROWS)
            decoder = "cuda" if (backend.name == "cuda" or _cuda_decoder_ok(dev)) else "torch"
            runs = []
            for i in range(warmup + repeat):
                r = sparse_prefill(lm, prompt, backend, ids, block_m, block_n, decoder)
                r.past = None  # the KV cache (GBs at 64K) is not needed for timing
                if i >= warmup:
                    runs.append(r)
            med = statistics.median
            block_lists = runs[-1].block_lists
            cells = sum(cell_density(x) for x in block_lists) / len(block_lists)
            blocks = sum(x.computed_blocks() for x in block_lists) / sum(x.causal_blocks() for x in block_lists)
            ttft = med(r.ttft_ms for r in runs)
            fwd = med(r.forward_ms for r in runs)
            ideal = full - (1 - cells) * attn_full
            srow = {**base, "mode": f"sift-{backend.name}", "ttft_ms": ttft, "runs_ms": [r.ttft_ms for r in runs],
                    "transfer_ms": med(r.transfer_ms for r in runs), "decode_ms": med(r.decode_ms for r in runs),
                    "forward_ms": fwd, "attention_ms": max(0.0, fwd - rest), "other_ms": rest,
                    "cell_density": cells, "block_density": blocks, "metadata_bytes": case.bits.nbytes(),
                    "ideal_ms": ideal, "ttft_over_ideal": ttft / ideal if ideal > 0 else None,
                    "speedup": full / ttft if ttft else None, "decoder": decoder}
            add_energy(srow, lambda: sparse_prefill(lm, prompt, backend, ids, block_m, block_n, decoder))
            rows.append(srow)
            log(f"  {L:>6} sift-{backend.name:<7}{ttft:9.1f} ms  ×{srow['speedup']:.2f}  density {cells:.3f}  "
                f"ideal {ideal:.1f} ms  decode {srow['decode_ms']:.1f} ms")
            del runs, block_lists

        for bname in backends:
            try:
                sift_mode(bname)
            except Exception as exc:  # one backend failing (e.g. out of memory) must not lose the rest
                rows.append({**base, "mode": f"sift-{bname}", "error": f"{type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"})
                log(f"  {L:>6} sift-{bname} failed: {rows[-1]['error']}")
                if dev.type == "cuda":
                    torch.cuda.empty_cache()

    def cacheblend_mode():
        from ..eval.kvreuse import is_llama_family

        if not is_llama_family(model):
            rows.append({**base, "mode": "cacheblend", "error": "needs a Llama-family model"})
        else:
            n_ctx = case.bits.layout.docs_end
            suffix = L - n_ctx
            cfg = model.config
            kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
            hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            hk = host_kv or HostKV(cfg.num_hidden_layers, n_ctx, kv_heads, hd, lm.dtype, pin=dev.type == "cuda")
            inv = inv_freq_of(model)
            ids1 = ids[0]
            cuda = dev.type == "cuda"
            mask = "bottom-right" if cuda else "causal"

            def blend(streaming=True, events=None):
                load = hk.loader(n_ctx, dev, inv, streaming=streaming and cuda)
                return blend_forward(model, ids1, load, suffix, ratio, 1, mask, keep_kv=False, layer_events=events)

            with torch.inference_mode():
                runs = timed(blend, dev, repeat, warmup)
                ttft = statistics.median(runs)
                resident = hk.loader(n_ctx, dev, inv, streaming=False)
                comp_runs = timed(lambda: blend_forward(model, ids1, resident, suffix, ratio, 1, mask, keep_kv=False),
                                  dev, repeat, 1)
                compute = statistics.median(comp_runs)
                per_layer = None
                if cuda:
                    start = torch.cuda.Event(enable_timing=True)
                    events: list = []
                    start.record()
                    blend_forward(model, ids1, resident, suffix, ratio, 1, mask, keep_kv=False, layer_events=events)
                    torch.cuda.synchronize(dev)
                    marks = [start] + events
                    per_layer = [marks[i].elapsed_time(marks[i + 1]) for i in range(len(events))]
                del resident
            layer_bytes = hk.bytes_per_layer(n_ctx)
            disk = layer_bytes / (ssd_gbps * 1e9) * 1e3  # ms per layer
            ssd = None
            if per_layer:  # layer i computes while layer i + 1 loads; layers before the check layer load nothing
                loads = [0.0] * hk.first + [disk] * (len(per_layer) - hk.first)
                ssd = loads[0] + sum(max(c, loads[i + 1] if i + 1 < len(loads) else 0.0)
                                     for i, c in enumerate(per_layer))
            crow = {**base, "mode": "cacheblend", "ttft_ms": ttft, "runs_ms": runs, "compute_ms": compute,
                    "kv_bytes": layer_bytes * (cfg.num_hidden_layers - hk.first),
                    "kv_source": "pinned host DRAM, streamed per layer" if cuda else "CPU memory",
                    "ssd_gbps": ssd_gbps, "ssd_model_ms": ssd, "recompute_ratio": ratio, "mask": mask,
                    "speedup": full / ttft if ttft else None}
            add_energy(crow, blend)
            rows.append(crow)
            log(f"  {L:>6} cacheblend  {ttft:9.1f} ms  (compute {compute:.1f} ms"
                + (f", SSD-modelled {ssd:.1f} ms" if ssd else "") + ")")
            if host_kv is None:
                del hk

    if "cacheblend" in modes:
        try:
            cacheblend_mode()
        except Exception as exc:
            rows.append({**base, "mode": "cacheblend", "error": f"{type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"})
            log(f"  {L:>6} cacheblend failed: {rows[-1]['error']}")
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _cuda_decoder_ok(dev) -> bool:
    """The bit-vector decode kernel runs on any backend's behalf where the CUDA backend could run (Hopper + CuPy)."""
    if dev.type != "cuda":
        return False
    try:
        from ...attention.cuda import CudaBackend

        return CudaBackend.available(dev)[0]
    except Exception:
        return False


def _device_name(dev) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# ---- drivers ---------------------------------------------------------------------------------------------------

def require_gpu(cpu_smoke: bool) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if cpu_smoke:
        return torch.device("cpu")
    raise SiftError("bench prefill times GPU prefill: no CUDA GPU is visible here. Run it on a GPU machine "
                    "(scripts/gpu_issue6.py); --cpu-smoke runs a tiny functional pass whose timings mean nothing")


def llama_cases(lengths, pattern: str = "paper", doc_tokens: int = 2048, tile: int = 64, sources=None,
                device="cuda", overrides: dict | None = None, seed: int = 0, lm=None, prefix_len: int = 16):
    """Yield a Case for the 8B-shaped model at each length (the model is built once, or `lm` is reused).
    prefix_len: a multiple of the KV block (64) puts every document on the block grid, so no KV block straddles
    two pages; the default 16 does not, which is the usual case for real prompts."""
    if lm is None:
        lm = llama3_8b_shaped(device, torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32,
                              overrides, seed)
    g = torch.Generator().manual_seed(seed)
    for L in lengths:
        lay = synthetic_layout(L, doc_tokens, prefix_len)
        if pattern == "paper":
            bits = paper_density_bits(lay, lm.n_layers, lm.n_heads, tile, seed=seed)
            label = f"drawn at the paper's densities (LA {PAPER_LA_DENSITY:.1%} tiles, CA {PAPER_CA_DENSITY:.1%} pages)"
        elif pattern == "sampled":
            if not sources:
                raise SiftError("pattern 'sampled' needs source profiles")
            bits = sampled_bits(lay, lm.n_layers, lm.n_heads, sources, tile, seed)
            label = f"sampled from real SmolLM2 profiles of {doc_tokens}-token documents"
        else:
            raise SiftError(f"pattern {pattern!r}: expected paper or sampled")
        if prefix_len % 64 == 0 and doc_tokens % 64 == 0:
            label += f", documents block-aligned ({prefix_len}-token prefix)"
        ids = torch.randint(0, lm.config.vocab_size, (L,), generator=g).tolist()
        yield Case(lm, lm.name, label, ids, bits)


def essay_token_docs(lm, data, doc_tokens: int, n: int) -> list[list[int]]:
    """The first `doc_tokens` tokens of the first `n` essays long enough (templated as in STUDY.md)."""
    from ..datasets import data_dir, essay_records
    from ...models import tokenize_documents
    from ..eval.prompt_sets import render_records

    docs = list(render_records(essay_records(data_dir(data), words=10 ** 6)).values())
    toks = [t[:doc_tokens] for t in tokenize_documents(lm.tokenizer, docs) if len(t) >= doc_tokens]
    if not toks:
        raise SiftError(f"no essay has {doc_tokens} tokens")
    return toks[:n]


def real_profiles(lm, docs: list[list[int]], tile: int = 64):
    """DocBits of documents profiled on the spot at the default thresholds."""
    from ...models import prefix_token_ids
    from ...config import resolve_profile_config
    from ...profile.forward import profile_batch

    cfg = resolve_profile_config(lm.device, {"tile": tile}).profile
    prefix = prefix_token_ids(lm.tokenizer)
    out = []
    for d in docs:
        out.extend(profile_batch(lm.model, prefix, [d], cfg))
    return prefix, out


def smol_cases(lm, lengths, data=None, doc_tokens: int = 2048, tile: int = 64, question: str = "What is this about?"):
    """SmolLM2 prompts of real essays (cycled when a length needs more), with their real profiles."""
    from ...bits import pack_doc
    from ...models import suffix_token_ids

    need = max(1, max(lengths) // doc_tokens + 1)
    docs = essay_token_docs(lm, data, doc_tokens, need)
    prefix, bits = real_profiles(lm, docs, tile)
    packed = [pack_doc(b.la_tiles, b.ca_pages) for b in bits]
    suffix = suffix_token_ids(lm.tokenizer, question)
    for L in lengths:
        body = L - len(prefix) - len(suffix)
        ids, toks, la, ca, names = list(prefix), [], [], [], []
        i = 0
        while body > 0:
            j = i % len(docs)
            take = min(body, len(docs[j]))
            if take < len(docs[j]):  # a shorter last document: profile it as it is
                _, extra = real_profiles(lm, [docs[j][:take]], tile)
                a, c = pack_doc(extra[0].la_tiles, extra[0].ca_pages)
            else:
                a, c = packed[j]
            toks.append(docs[j][:take])
            la.append(a)
            ca.append(c)
            names.append(f"essay{j}#{i}")
            body -= take
            i += 1
        for t in toks:
            ids.extend(t)
        ids.extend(suffix)
        lay = PromptLayout.build(len(prefix), names, [len(t) for t in toks], len(suffix))
        pb = PromptBits.pack(lay, la, ca, tile, lm.n_layers, lm.n_heads)
        note = "real profiles" + (" (past the trained context: speed only)" if L > lm.max_context else "")
        yield Case(lm, lm.name, note, ids, pb)


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
    return list(out.values())


__all__ = ["Case", "EnergyMeter", "HostKV", "llama3_8b_shaped", "llama_cases", "paper_density_bits",
           "require_gpu", "run_case", "sampled_bits", "smol_cases", "summarize_rows", "synthetic_layout",
           "energy_metrics"]


CPU_SMOKE_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=512)


def run_bench(models=("llama3-8b",), lengths=LENGTHS, pattern: str = "paper", doc_tokens: int = 2048,
              modes=("full", "sift", "cacheblend"), backends=("auto",), repeat: int = 3, warmup: int = 1,
              energy: bool = True, ratio: float = 0.15, ssd_gbps: float = 3.8, data=None, smol_model: str | None = None,
              cpu_smoke: bool = False, deadline: float | None = None, log=print, on_rows=None) -> list[dict]:
    """Every (model, length) case; rows of `run_case`. models: 'llama3-8b' (the 8B-shaped model with `pattern`
    bits) and/or 'smollm2' (real profiles; `smol_model` is a --model spec, default the bundled GGUF)."""
    import gc

    device = require_gpu(cpu_smoke)
    rows: list[dict] = []

    def emit(new):
        rows.extend(new)
        if on_rows:
            on_rows(new)

    def out_of_time():
        return deadline is not None and time.perf_counter() > deadline

    smol = None
    sources = None

    def load_smol():
        nonlocal smol
        if smol is None:
            from ...models import load_model

            smol = load_model(smol_model, device=str(device))
        return smol

    for name in models:
        if name in ("llama3-8b", "llama"):
            if pattern == "sampled" and sources is None:
                lm_s = load_smol()
                sources = real_profiles(lm_s, essay_token_docs(lm_s, data, doc_tokens, 16))[1]
            overrides = CPU_SMOKE_LLAMA if cpu_smoke else None
            host_kv = None
            cases = llama_cases(lengths, pattern, doc_tokens, 64, sources, str(device), overrides)
            for case in cases:
                if out_of_time():
                    emit([{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids),
                           "mode": "all", "error": "skipped: time budget"}])
                    continue
                if "cacheblend" in modes and host_kv is None:
                    cfg = case.lm.model.config
                    host_kv = HostKV(cfg.num_hidden_layers, max(lengths), cfg.num_key_value_heads, cfg.head_dim,
                                     case.lm.dtype, pin=device.type == "cuda")
                try:
                    emit(run_case(case, modes, backends, repeat, warmup, energy, ratio=ratio, ssd_gbps=ssd_gbps,
                                  host_kv=host_kv, log=log))
                except Exception as exc:  # one case failing must not lose the others
                    emit([{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids), "mode": "all",
                           "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}])
                    log(f"  case {len(case.input_ids)} failed: {exc}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            del cases, host_kv
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        elif name in ("smollm2", "smol"):
            lm_s = load_smol()
            for case in smol_cases(lm_s, lengths, data, doc_tokens):
                if out_of_time():
                    emit([{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids),
                           "mode": "all", "error": "skipped: time budget"}])
                    continue
                try:
                    emit(run_case(case, modes, backends, repeat, warmup, energy, ratio=ratio, ssd_gbps=ssd_gbps,
                                  log=log))
                except Exception as exc:
                    emit([{"model": case.label, "pattern": case.pattern, "tokens": len(case.input_ids), "mode": "all",
                           "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}])
                    log(f"  case {len(case.input_ids)} failed: {exc}")
        else:
            raise SiftError(f"--models {name}: expected llama3-8b or smollm2")
    return rows
