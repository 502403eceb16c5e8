"""Offline profile of documents (SPEC §3): run the model on `prefix ‖ doc`, turn every layer's and head's
attention probabilities into LA tile bits and CA page bits.

The model runs its normal forward; a registered attention function computes each layer's output with SDPA and,
beside it, the statistics, in fp32, one head group and one band of query rows at a time: no n×n matrix for all
heads is ever held, so memory is bounded by `stats_budget_bytes` whatever the document length.

That per-document torch path (`doc_attention_bits`) is the reference. `ProfileConfig.stats = "triton"` (the default
"auto" on CUDA) computes the same bits for the whole batch with the Triton kernels of `stats_triton.py`, which
never materialise probabilities.
"""

from __future__ import annotations

import threading
from typing import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .attention.swap import swapped_attention
from .bits import n_pages, pack_doc
from .config import ProfileConfig

ATTN_NAME = "sift_profile"


@dataclass
class DocBits:
    """Bits of one document, all layers and heads."""

    la_tiles: torch.Tensor  # bool [L, H, P, P] lower triangle
    ca_pages: torch.Tensor  # bool [L, H, P]
    # Filled for a whole batch at once by the fast path (`_batch_doc_bits`); the same values as computed below.
    packed: tuple[bytes, bytes] | None = field(default=None, repr=False, compare=False)
    densities: tuple[float, float] | None = field(default=None, repr=False, compare=False)

    def pack(self) -> tuple[bytes, bytes]:
        return self.packed if self.packed is not None else pack_doc(self.la_tiles, self.ca_pages)

    def la_density(self) -> float:
        if self.densities is not None:
            return self.densities[0]
        p = self.ca_pages.shape[-1]
        return float(self.la_tiles.sum()) / (self.la_tiles.shape[0] * self.la_tiles.shape[1] * p * (p + 1) / 2)

    def ca_density(self) -> float:
        if self.densities is not None:
            return self.densities[1]
        return float(self.ca_pages.float().mean())


def probability_bands(q: torch.Tensor, k: torch.Tensor, prefix_len: int, n_doc: int, scale: float, tile: int,
                      budget_bytes: int):
    """Yield (h0, h1, r0, doc_probs, doc_causal) over bands of heads and of the document's query rows.

    doc_probs [h1 - h0, R, r1] fp32: softmax of rows r0 … r0 + R - 1 of the document (normalised over every key
    they see, prefix included), restricted to the document's keys 0 … r1 - 1; non-causal entries are exactly 0.
    doc_causal [R, r1]: which entries are causal. Bands start at multiples of `tile`, and about four fp32 copies
    of a [heads, rows, S] band are alive at once, so memory stays near `budget_bytes` whatever the length.
    """
    H = q.shape[0]
    group = H // k.shape[0]
    S = prefix_len + n_doc
    dev = q.device
    per_head_row = 16 * S
    heads = max(1, min(H, budget_bytes // (per_head_row * tile)))
    rows = max(tile, (budget_bytes // (per_head_row * heads)) // tile * tile)
    key_pos = torch.arange(S, device=dev)
    for h0 in range(0, H, heads):
        h1 = min(H, h0 + heads)
        qh = q[h0:h1, prefix_len:S].float()
        kh = k[torch.arange(h0, h1, device=dev) // group, :S].float()
        for r0 in range(0, n_doc, rows):
            r1 = min(n_doc, r0 + rows)
            R, K = r1 - r0, prefix_len + r1
            scores = torch.matmul(qh[:, r0:r1], kh[:, :K].transpose(1, 2)).mul_(scale)
            causal = key_pos[None, :K] <= (prefix_len + r0 + torch.arange(R, device=dev))[:, None]  # [R, K]
            scores.masked_fill_(~causal, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            del scores
            yield h0, h1, r0, probs[:, :, prefix_len:], causal[:, prefix_len:]
            del probs


def band_tile_max(doc_probs: torch.Tensor, doc_causal: torch.Tensor, tile: int, mask: bool = True) -> torch.Tensor:
    """[h, R, C] band → [h, ceil(R/T), ceil(C/T)] maximum probability of each tile's causal cells (-1 if none).

    mask=False skips hiding the non-causal cells: they are exactly 0, which only a zero threshold can tell apart.
    """
    h, R, C = doc_probs.shape
    if mask:
        doc_probs = doc_probs.masked_fill(~doc_causal, -1.0)
    rows_pad, cols_pad = -(-R // tile) * tile, -(-C // tile) * tile
    if rows_pad != R or cols_pad != C:
        doc_probs = F.pad(doc_probs, (0, cols_pad - C, 0, rows_pad - R), value=-1.0)
    return doc_probs.view(h, rows_pad // tile, tile, cols_pad // tile, tile).amax(dim=(2, 4))


def doc_attention_bits(q: torch.Tensor, k: torch.Tensor, prefix_len: int, n_doc: int, scale: float,
                       cfg: ProfileConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """LA tiles bool [H, P, P] and CA pages bool [H, P] of one document.

    q [H, S, D], k [H_kv, S, D] are the layer's post-RoPE queries and keys of `prefix ‖ doc` (S may include right
    padding, which is ignored). Probabilities are normalised over every key a query sees, prefix included.
    """
    H = q.shape[0]
    T = cfg.tile
    P = n_pages(n_doc, T)
    dev = q.device
    la = torch.zeros(H, P, P, dtype=torch.bool, device=dev)
    counts = torch.zeros(H, n_doc, dtype=torch.int32, device=dev)
    for h0, h1, r0, doc_probs, doc_causal in probability_bands(q, k, prefix_len, n_doc, scale, T,
                                                               cfg.stats_budget_bytes):
        tile_max = band_tile_max(doc_probs, doc_causal, T, mask=cfg.alpha <= 0)
        la[h0:h1, r0 // T: r0 // T + tile_max.shape[1], : tile_max.shape[2]] = tile_max >= cfg.alpha
        high = doc_probs >= cfg.beta
        if cfg.beta <= 0:
            high &= doc_causal
        counts[h0:h1, : doc_probs.shape[2]] += high.sum(1, dtype=torch.int32)
        del doc_probs, high, tile_max  # before the next band is computed
    la &= torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    la[:, torch.arange(P), torch.arange(P)] = True  # diagonal tiles are always computed

    visible = (n_doc - torch.arange(n_doc, device=dev)).float()  # queries i >= j that see key j
    hot = (counts.float() / visible) > cfg.gamma  # [H, n]
    hot = F.pad(hot, (0, P * T - n_doc), value=False)
    return la, hot.view(H, P, T).any(-1)


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


def _profile_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for the profiling forward: SDPA output plus per-document statistics."""
    st: _BatchState = _state.current
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = causal_sdpa(query, key, value, scaling)
    layer = module.layer_idx
    if st.fast:
        from .stats_triton import batch_attention_stats

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
        la, ca = doc_attention_bits(query[b], key[b], st.prefix_len, n, scaling, st.cfg)
        st.la[b][layer], st.ca[b][layer] = la, ca
    return out.transpose(1, 2).contiguous(), None


def profile_batch(model, prefix_ids: list[int], docs: list[list[int]], cfg: ProfileConfig) -> list[DocBits]:
    """Bits of each document in `docs` (token id lists), run as one right-padded batch of `prefix ‖ doc`.

    Right padding is harmless under causal attention: a real token never sees a pad token.
    """
    return launch_profile_batch(model, prefix_ids, docs, cfg)()


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host → device without making the host wait for the GPU (a pageable copy can; a pinned one does not)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@torch.inference_mode()
def launch_profile_batch(model, prefix_ids: list[int], docs: list[list[int]], cfg: ProfileConfig
                         ) -> Callable[[], list[DocBits]]:
    """`profile_batch` in two halves: this call enqueues the batch's GPU work (forward, statistics, folding,
    packing, device → host copies) and returns `collect`, which waits for it and returns the DocBits. On the fast
    path the host does not wait for the GPU in between, so a caller can launch batch i + 1 before collecting batch
    i and keep the GPU busy while the host turns finished bits into shard rows. Other paths finish here."""
    device = next(model.parameters()).device
    longest = len(prefix_ids) + max(len(d) for d in docs)
    pad = 0
    rows = np.full((len(docs), longest), pad, dtype=np.int64)
    rows[:, : len(prefix_ids)] = prefix_ids
    for i, d in enumerate(docs):
        rows[i, len(prefix_ids): len(prefix_ids) + len(d)] = d
    n_layers = model.config.num_hidden_layers
    fast = resolve_stats(cfg.stats, device) == "triton"
    lengths = [len(d) for d in docs]
    with swapped_attention(model, ATTN_NAME, _profile_attention):
        lengths_dev = _to_device(torch.tensor(lengths, dtype=torch.int32), device) if fast else None
        _state.current = _BatchState(cfg, len(prefix_ids), lengths, n_layers, fast=fast, lengths_dev=lengths_dev)
        try:
            base = getattr(model, "model", model)  # the decoder stack: no LM head over every position
            base(input_ids=_to_device(torch.from_numpy(rows), device), use_cache=False)
            st = _state.current
        finally:
            _state.current = None
    if fast:  # all layers folded at once, then packed on the device per group of equal page counts
        from .stats_triton import fold_bits

        B, L, H, P, _ = st.la_raw.shape
        n_max = st.cnt_raw.shape[-1]
        la, ca = fold_bits(st.la_raw.view(B, L * H, P, P), st.cnt_raw.view(B, L * H, n_max), st.lengths_dev, n_max,
                           cfg)
        return _batch_doc_bits(la.view(B, L, H, P, P), ca.view(B, L, H, P), lengths, cfg.tile)
    bits = [DocBits(torch.stack(st.la[b]).cpu(), torch.stack(st.ca[b]).cpu()) for b in range(len(docs))]
    return lambda: bits


def _batch_doc_bits(la: torch.Tensor, ca: torch.Tensor, lengths: list[int], tile: int
                    ) -> Callable[[], list[DocBits]]:
    """Per-document DocBits from batch tensors la bool [B, L, H, P, P], ca bool [B, L, H, P] (on the GPU in the
    fast path), with the packed vectors and densities computed on that device for all documents of one page
    count at once: bytes and values identical to `pack_doc` and the DocBits methods (tested), without per-document
    numpy work, which costs more than the GPU work on short passages and ~0.3 s per 8K-token document at 8B.
    Enqueues the work and the copies to the host; the returned function waits for them and builds the DocBits."""
    groups: dict[int, list[int]] = {}
    for b, n in enumerate(lengths):
        groups.setdefault(n_pages(n, tile), []).append(b)
    _, L, H = la.shape[:3]
    dev = la.device
    weights = 2 ** torch.arange(7, -1, -1, dtype=torch.int32, device=dev)  # 128 … 1: MSB first

    def packbits(bits: torch.Tensor) -> torch.Tensor:  # [..., n] bool → [..., ceil(n/8)] uint8, MSB first
        x = F.pad(bits.to(torch.int32), (0, -bits.shape[-1] % 8))
        return (x.view(*x.shape[:-1], -1, 8) * weights).sum(-1).to(torch.uint8)

    def to_host(t: torch.Tensor) -> torch.Tensor:  # pinned and asynchronous on CUDA: read only after `done`
        return t.to("cpu", non_blocking=dev.type == "cuda")

    pending = []
    for P, idx in groups.items():
        G = len(idx)
        sel = _to_device(torch.tensor(idx), dev)
        la_g, ca_g = la.index_select(0, sel)[..., :P, :P], ca.index_select(0, sel)[..., :P]
        rows, cols = torch.tril_indices(P, P, device=dev)
        flat = la_g[..., rows, cols].reshape(G, L * H, -1)  # row-major lower triangle, as pack_la
        pending.append((P, idx, to_host(packbits(flat)), to_host(packbits(ca_g.reshape(G, L * H, P))),
                        to_host(flat.reshape(G, -1).sum(1)), to_host(ca_g.reshape(G, -1).sum(1)),
                        to_host(la_g), to_host(ca_g)))
    done = torch.cuda.Event() if dev.type == "cuda" else None
    if done is not None:
        done.record()

    def collect() -> list[DocBits]:
        if done is not None:
            done.synchronize()
        out: list[DocBits | None] = [None] * len(lengths)
        for P, idx, la_bytes, ca_bytes, la_sum, ca_cnt, la_cpu, ca_cpu in pending:
            la_bytes, ca_bytes, la_sum = la_bytes.numpy(), ca_bytes.numpy(), la_sum.tolist()
            # fp32 count / size: what DocBits.ca_density's torch mean gives (the count is exact; tested)
            ca_mean = (ca_cnt.numpy().astype(np.float32) / np.float32(L * H * P)).tolist()
            tiles = L * H * P * (P + 1) / 2
            for j, b in enumerate(idx):
                out[b] = DocBits(la_cpu[j], ca_cpu[j], packed=(la_bytes[j].tobytes(), ca_bytes[j].tobytes()),
                                 densities=(float(la_sum[j]) / tiles, ca_mean[j]))
        return out

    return collect


def resolve_stats(stats: str, device: torch.device) -> str:
    """The statistics path to run: 'torch' or 'triton' ('auto': triton on CUDA when importable)."""
    from .errors import SiftError
    from .stats_triton import usable_on

    dev = torch.device(device)
    if stats == "torch" or (stats == "auto" and dev.type != "cuda"):
        return "torch"
    usable = usable_on(dev)
    if stats == "triton" and not usable:
        raise SiftError("--stats triton needs the triton package and a CUDA GPU (or TRITON_INTERPRET=1 on CPU); "
                        "use --stats torch")
    return "triton" if usable else "torch"


def plan_batches(lengths: list[int], prefix_len: int, batch_tokens: int) -> list[list[int]]:
    """Group document indices into padded batches of at most `batch_tokens` tokens (a longer document runs alone).

    Documents are taken in order of length, so a batch wastes little on padding; the grouping depends only on
    the lengths given, which keeps output deterministic.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, current, longest = [], [], 0
    for i in order:
        size = prefix_len + lengths[i]
        if current and max(longest, size) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    return batches
