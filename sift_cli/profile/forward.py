"""The profiling forward (SPEC §3): run the model on `prefix ‖ doc` and turn every layer's and head's attention
probabilities into LA tile bits and CA page bits.

The model runs its normal forward; a swapped-in attention function computes each layer's output with SDPA and,
beside it, the statistics, in fp32. The per-document torch path (`statistics.doc_attention_bits`) is the
reference; `ProfileConfig.stats = "triton"` (the default "auto" on CUDA) computes the same bits for the whole batch
with the Triton kernels of `triton_statistics.py`, which never materialise probabilities. Triton is imported only
when that path runs: it is optional, and `TRITON_INTERPRET` must be set before its first import.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from ..attention.features import call_features, dense_featured, for_length
from ..attention.swap import swapped_attention
from ..config import ProfileConfig
from ..errors import SiftError
from ..model_features import features_of
from .batches import padded_batch, to_device
from .doc_bits import DocBits, batch_doc_bits
from .statistics import doc_attention_bits

ATTN_NAME = "sift_profile"


@dataclass
class _BatchState:
    cfg: ProfileConfig
    prefix_len: int
    doc_lengths: list[int]
    n_layers: int
    la: list[list] = field(default_factory=list)  # [doc][layer] → bool [H, P, P]
    ca: list[list] = field(default_factory=list)
    fast: bool = False  # triton path: raw statistics of every layer go into the two buffers below
    lengths_dev: torch.Tensor | None = None
    la_raw: torch.Tensor | None = None  # int8 [B, layers, H, P, P], tile hits
    cnt_raw: torch.Tensor | None = None  # int32 [B, layers, H, n_max], per-key β counts
    on_layer: Callable[[int], None] | None = None  # called with the number of layers done (the CPU's progress)

    def __post_init__(self):
        if not self.fast:
            self.la = [[None] * self.n_layers for _ in self.doc_lengths]
            self.ca = [[None] * self.n_layers for _ in self.doc_lengths]


_state = threading.local()


def causal_sdpa(query, key, value, scaling):
    """Causal SDPA as the stock transformers path calls it (GQA inside the kernel, no repeated K/V). Every forward
    that must match the profiling forward (the sweep statistics, the evaluation probes) attends through this."""
    group = query.shape[1] // key.shape[1]
    causal = query.shape[2] > 1
    if group > 1 and key.shape[-1] == value.shape[-1] <= 256:
        return F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling, enable_gqa=True)
    if group > 1:
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling)


def model_attention(query, key, value, scaling, feats):
    """The layer's dense attention output as the model defines it: `causal_sdpa` for a plain layer, else with its
    window, soft-cap and sinks (`attention.features`)."""
    return causal_sdpa(query, key, value, scaling) if feats.plain else dense_featured(query, key, value, scaling,
                                                                                      feats)


def _profile_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for the profiling forward: SDPA output plus per-document statistics."""
    st: _BatchState = _state.current
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    feats = for_length(call_features(kwargs), key.shape[2])
    out = model_attention(query, key, value, scaling, feats)
    layer = module.layer_idx
    if st.fast:
        if not feats.plain:  # resolve_stats chose torch for such a batch; never compute other statistics
            raise SiftError(f"the Triton statistics do not compute {', '.join(feats.names())}")
        from .triton_statistics import batch_attention_stats

        n_max = max(st.doc_lengths)
        if st.la_raw is None:  # one zeroed buffer per batch; folded once after the forward
            B, H = query.shape[:2]
            P = -(-n_max // st.cfg.tile)
            st.la_raw = torch.zeros(B, st.n_layers, H, P, P, dtype=torch.int8, device=query.device)
            st.cnt_raw = torch.zeros(B, st.n_layers, H, n_max, dtype=torch.int32, device=query.device)
        batch_attention_stats(query, key, st.prefix_len, st.lengths_dev, n_max, scaling, st.cfg,
                              st.la_raw[:, layer], st.cnt_raw[:, layer])
        return out.transpose(1, 2).contiguous(), None
    for b, n in enumerate(st.doc_lengths):
        la, ca = doc_attention_bits(query[b], key[b], st.prefix_len, n, scaling, st.cfg, feats)
        st.la[b][layer], st.ca[b][layer] = la, ca
    if st.on_layer is not None:
        st.on_layer(layer + 1)
    return out.transpose(1, 2).contiguous(), None


def profile_batch(model, prefix_ids: list[int], docs: list[list[int]], cfg: ProfileConfig) -> list[DocBits]:
    """Bits of each document in `docs` (token id lists), run as one right-padded batch of `prefix ‖ doc`.

    Right padding is harmless under causal attention: a real token never sees a pad token.
    """
    return launch_profile_batch(model, prefix_ids, docs, cfg)()


@torch.inference_mode()
def launch_profile_batch(model, prefix_ids: list[int], docs: list[list[int]], cfg: ProfileConfig,
                         on_layer: Callable[[int], None] | None = None) -> Callable[[], list[DocBits]]:
    """`profile_batch` in two halves: this call enqueues the batch's GPU work (forward, statistics, folding,
    packing, device → host copies) and returns `collect`, which waits for it and returns the DocBits. On the fast
    path the host does not wait for the GPU in between, so a caller can launch batch i + 1 before collecting batch
    i and keep the GPU busy while the host turns finished bits into shard rows. Other paths finish here.
    on_layer(layers_done): called as each layer's statistics are done on the torch path, where a batch takes
    minutes on a CPU (not on the fast path, whose layers are only enqueued here)."""
    device = next(model.parameters()).device
    rows = padded_batch(prefix_ids, docs)
    n_layers = model.config.num_hidden_layers
    lengths = [len(d) for d in docs]
    feats = features_of(model)  # a window longer than the batch's rows hides nothing: auto may take triton then
    names = feats.names() if cfg.stats == "triton" else feats.for_length(len(prefix_ids) + max(lengths)).names()
    fast = cfg.rule == "paper" and resolve_stats(cfg.stats, device, names) == "triton"
    lengths_dev = to_device(torch.tensor(lengths, dtype=torch.int32), device) if fast else None
    st = _BatchState(cfg, len(prefix_ids), lengths, n_layers, fast=fast, lengths_dev=lengths_dev,
                     on_layer=None if fast else on_layer)
    with swapped_attention(model, ATTN_NAME, _profile_attention, _state, current=st):
        base = getattr(model, "model", model)  # the decoder stack: no LM head over every position
        base(input_ids=to_device(rows, device), use_cache=False)
    if fast:  # all layers folded at once, then packed on the device per group of equal page counts
        from .triton_statistics import fold_bits

        B, L, H, P, _ = st.la_raw.shape
        n_max = st.cnt_raw.shape[-1]
        la, ca = fold_bits(st.la_raw.view(B, L * H, P, P), st.cnt_raw.view(B, L * H, n_max), st.lengths_dev, n_max,
                           cfg)
        return batch_doc_bits(la.view(B, L, H, P, P), ca.view(B, L, H, P), lengths, cfg.tile)
    bits = [DocBits(torch.stack(st.la[b]).cpu(), torch.stack(st.ca[b]).cpu()) for b in range(len(docs))]
    return lambda: bits


def resolve_stats(stats: str, device: torch.device, features: list[str] = ()) -> str:
    """The statistics path to run: 'torch' or 'triton' ('auto': triton on CUDA when importable). features: the
    model's attention extras (`ModelFeatures.names`); the Triton kernels compute plain causal attention only, so
    'auto' takes the torch path for such a model and 'triton' is refused."""
    from .triton_statistics import usable_on

    dev = torch.device(device)
    if stats == "triton" and features:
        raise SiftError(f"--stats triton computes plain causal attention; this model has {', '.join(features)}: "
                        "use --stats torch (or auto)")
    if stats == "torch" or (stats == "auto" and (dev.type != "cuda" or features)):
        return "torch"
    usable = usable_on(dev)
    if stats == "triton" and not usable:
        raise SiftError("--stats triton needs the triton package and a CUDA GPU (or TRITON_INTERPRET=1 on CPU); "
                        "use --stats torch")
    return "triton" if usable else "torch"
