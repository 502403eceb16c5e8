"""Full recompute and SIFT on the same prompt, in one process: timings, agreement and both answers."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .attention.backends import get_backend
from .attention.base import BlockLists
from .attention.cuda import CudaBackend
from .attention.integration import prepare_plan, sparse_attention
from .block_lists import cell_density, decode_layer
from .cuda.decode import CudaDecoder
from .errors import SiftError
from .layout import PromptBits
from .models import LoadedModel, load_model
from .prompt import Prompt, assemble
from .shards.reader import ShardSet


def sync_device(device) -> None:
    """Wait for the device's queued work (timings that include the GPU's time); a no-op off CUDA."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def decode_all_layers(bits: PromptBits, n_layers: int, block_m: int, block_n: int,
                      decoder: str = "torch") -> list[BlockLists]:
    """Every layer's CSR lists, with the PyTorch decoder or the CUDA kernel (bits already on the device)."""
    if decoder == "cuda":
        dec = CudaDecoder(bits, block_m, block_n)
        return [dec.layer(layer) for layer in range(n_layers)]
    return [decode_layer(bits, layer, block_m, block_n) for layer in range(n_layers)]


def choose_decoder(device: torch.device) -> str:
    """The CUDA decode kernel wherever it can run (any backend reads its lists), else the PyTorch decoder."""
    if device.type != "cuda":
        return "torch"
    return "cuda" if CudaBackend.available(device)[0] else "torch"


@dataclass
class SparseRun:
    logits: torch.Tensor  # fp32 [vocab] at the last position
    past: object
    transfer_ms: float
    decode_ms: float
    forward_ms: float
    block_lists: list[BlockLists] = field(repr=False)

    @property
    def ttft_ms(self) -> float:
        return self.transfer_ms + self.decode_ms + self.forward_ms


@torch.inference_mode()
def dense_prefill(lm: LoadedModel, ids: torch.Tensor):
    t0 = time.perf_counter()
    out = lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    sync_device(lm.device)
    return out.logits[0, -1].float(), out.past_key_values, (time.perf_counter() - t0) * 1e3


@torch.inference_mode()
def sparse_prefill(lm: LoadedModel, prompt: Prompt, backend, ids: torch.Tensor, block_m: int, block_n: int,
                   decoder: str = "torch") -> SparseRun:
    dev = lm.device
    sync_device(dev)
    t0 = time.perf_counter()
    bits = prompt.bits.to(dev)  # every layer's bit vectors go to the device once per prompt
    sync_device(dev)
    t1 = time.perf_counter()
    block_lists = decode_all_layers(bits, lm.n_layers, block_m, block_n, decoder)
    plan = prepare_plan(backend, block_lists)
    sync_device(dev)
    t2 = time.perf_counter()
    with sparse_attention(lm.model, plan):
        out = lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    sync_device(dev)
    t3 = time.perf_counter()
    return SparseRun(out.logits[0, -1].float(), out.past_key_values, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                     (t3 - t2) * 1e3, block_lists)


@torch.inference_mode()
def greedy_generate(lm: LoadedModel, logits: torch.Tensor, past, max_new_tokens: int) -> list[int]:
    """Dense greedy generation from a prefilled KV cache."""
    tokens = []
    eos = lm.model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    for _ in range(max_new_tokens):
        tok = int(logits.argmax())
        tokens.append(tok)
        if tok in eos:
            break
        out = lm.model(input_ids=torch.tensor([[tok]], device=lm.device), past_key_values=past, use_cache=True)
        logits, past = out.logits[0, -1].float(), out.past_key_values
    return tokens


def compare_logits(dense: torch.Tensor, sparse: torch.Tensor) -> dict:
    logp = torch.log_softmax(dense.double(), -1)
    logq = torch.log_softmax(sparse.double(), -1)
    kl = float((logp.exp() * (logp - logq)).sum())
    return {"first_token_match": int(dense.argmax()) == int(sparse.argmax()),
            "max_abs_logit_diff": float((dense - sparse).abs().max()), "kl": max(kl, 0.0),
            "dense_first_token": int(dense.argmax()), "sift_first_token": int(sparse.argmax())}


def density_report(block_lists: list[BlockLists]) -> dict:
    per_layer = [{"layer": i, "blocks": b.density(), "cells": cell_density(b)} for i, b in enumerate(block_lists)]
    computed = sum(b.computed_blocks() for b in block_lists)
    causal = sum(b.causal_blocks() for b in block_lists)
    return {"blocks": computed / causal, "cells": sum(r["cells"] for r in per_layer) / len(per_layer),
            "computed_blocks": computed, "causal_blocks": causal, "per_layer": per_layer}


def run_prefill(lm: LoadedModel, prompt: Prompt, backend_name: str = "auto", repeat: int = 3,
                max_new_tokens: int = 16, block_m: int = 128, block_n: int = 64, warmup: int = 1) -> dict:
    """Dense and SIFT prefill of `prompt`, side by side; returns the report as a plain dict."""
    backend = get_backend(backend_name, lm.device)
    decoder = choose_decoder(lm.device)
    ids = torch.tensor([prompt.input_ids], device=lm.device)
    for _ in range(max(0, warmup)):  # compile / autotune / allocate outside the timed runs
        dense_prefill(lm, ids)
        sparse_prefill(lm, prompt, backend, ids, block_m, block_n, decoder)
    dense_times, sift_runs = [], []
    for _ in range(max(1, repeat)):
        d_logits, d_past, ms = dense_prefill(lm, ids)
        dense_times.append(ms)
        sift_runs.append(sparse_prefill(lm, prompt, backend, ids, block_m, block_n, decoder))
    s = sift_runs[-1]
    med = statistics.median
    dense_ms, sift_ms = med(dense_times), med(r.ttft_ms for r in sift_runs)
    decode_ms = med(r.decode_ms for r in sift_runs)
    dense_tokens = greedy_generate(lm, d_logits, d_past, max_new_tokens)
    sift_tokens = greedy_generate(lm, s.logits, s.past, max_new_tokens)
    tok = lm.tokenizer
    return {
        "model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
        "backend": backend.name, "decoder": decoder, "block_m": block_m, "block_n": block_n,
        "tile_size": prompt.bits.tile, "doc_ids": prompt.doc_ids,
        "prompt_tokens": prompt.segment_tokens(),
        "density": density_report(s.block_lists),
        "dense": {"ttft_ms": dense_ms, "runs_ms": dense_times, "text": tok.decode(dense_tokens,
                                                                                   skip_special_tokens=True)},
        "sift": {"ttft_ms": sift_ms, "runs_ms": [r.ttft_ms for r in sift_runs],
                 "transfer_ms": med(r.transfer_ms for r in sift_runs), "decode_ms": decode_ms,
                 "forward_ms": med(r.forward_ms for r in sift_runs),
                 "text": tok.decode(sift_tokens, skip_special_tokens=True)},
        "speedup": dense_ms / sift_ms if sift_ms > 0 else None,
        "decode_ms": decode_ms, "decode_share_of_ttft": decode_ms / sift_ms if sift_ms > 0 else None,
        "same_answer": dense_tokens == sift_tokens,
        "metadata_bytes": prompt.bits.nbytes(),
        **compare_logits(d_logits, s.logits),
    }


def prefill_from_shards(shards_dir: str | Path, doc_ids: list[str], query: str, model: str | None = None,
                        backend: str = "auto", device: str | None = "auto", dtype: str | None = "auto",
                        max_new_tokens: int = 16, repeat: int = 3, block_m: int = 128, block_n: int = 64,
                        trust_remote_code: bool = False, online: bool = False) -> dict:
    """`sift prefill`: the prompt of `doc_ids` and `query` from a shard set, dense and SIFT side by side."""
    if block_n not in (64, 128) or block_m not in (64, 128, 192, 256):
        raise SiftError("--block-n must be 64 or 128 and --block-m one of 64, 128, 192, 256")
    shards = ShardSet(shards_dir)
    lm = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, online=online)
    prompt = assemble(shards, lm, doc_ids, query)
    return run_prefill(lm, prompt, backend, repeat=repeat, max_new_tokens=max_new_tokens, block_m=block_m,
                       block_n=block_n)
