"""The prompts `sift bench prefill` times, with the bits SIFT reads for them.

- **SmolLM2** (the bundled model or any checkpoint) with *real* profiles: essays cut to `doc_tokens` tokens,
  profiled on the spot; past the model's trained context (8K) the numbers are speed only.
- **A Llama-3-8B-shaped model**: the published Llama-3.1-8B config (32 layers, 32 query / 8 KV heads,
  head_dim 128, 128K context) with random bf16 weights (speed does not depend on weight values), its tile
  patterns either drawn at the paper's densities (`pattern="paper"`: LA 27.3% of tiles, CA 5.8% of pages, the
  diagonal always set) or sampled per (document, layer, head) from real SmolLM2 profiles of documents of the
  same length (`pattern="sampled"`). Every row says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...bits import n_pages, pack_doc
from ...config import resolve_profile_config
from ...errors import SiftError
from ...layout import PromptBits, PromptLayout, random_prompt_bits
from ...models import LoadedModel
from ...prefill.assemble import Prompt, build_prompt
from ...prefill.lookup import BitsSource
from ...profile.forward import profile_batch
from ...tokens import prefix_token_ids, suffix_token_ids, tokenize_documents
from ..datasets import data_dir, essay_records
from ..eval.prompt_sets import render_records
from .llama import LLAMA31_8B_CONFIG, LLAMA31_8B_NAME, random_llama

PAPER_LA_DENSITY = 1 - 0.727  # paper §3.2: chosen LA sparsity 72.7%
PAPER_CA_DENSITY = 1 - 0.942  # paper §3.4: chosen CA sparsity 94.2%
CPU_SMOKE_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=512)


@dataclass
class Case:
    lm: LoadedModel
    label: str  # model label
    pattern: str  # how the bits were made
    input_ids: list[int]
    bits: PromptBits
    source: BitsSource | None = None  # the set SIFT fetches the bits from inside its timing (corpus cases)

    def prompt(self) -> Prompt:
        lay = self.bits.layout
        return Prompt(self.input_ids, lay, self.bits, [d.doc_id for d in lay.docs], "bench", source=self.source)


# ---- models ----------------------------------------------------------------------------------------------------

def llama3_8b_shaped(device="cuda", dtype=torch.bfloat16, overrides: dict | None = None, seed: int = 0):
    """Random-weight model with the published Llama-3.1-8B shapes, as a LoadedModel."""
    name = LLAMA31_8B_NAME if not overrides else f"Llama-shaped {overrides}"
    return random_llama({**LLAMA31_8B_CONFIG, **(overrides or {})}, device, dtype, seed, name)


# ---- prompts and bit patterns ----------------------------------------------------------------------------------

def synthetic_layout(total: int, doc_tokens: int | tuple[int, int], prefix_len: int = 16, suffix_len: int = 32,
                     seed: int = 0) -> PromptLayout:
    """prefix ‖ docs ‖ suffix, exactly `total` tokens: docs of `doc_tokens` tokens, or of lengths drawn uniformly
    in the range (lo, hi); the last document is cut to fit."""
    body = total - prefix_len - suffix_len
    if body < 1:
        raise SiftError(f"length {total} is too short for a prompt")
    lo, hi = doc_tokens if isinstance(doc_tokens, tuple) else (doc_tokens, doc_tokens)
    rng = np.random.default_rng(seed)
    lengths = []
    while body > 0:
        n = min(body, int(rng.integers(lo, hi + 1)))
        lengths.append(n)
        body -= n
    return PromptLayout.build(prefix_len, [f"d{i}" for i in range(len(lengths))], lengths, suffix_len)


def describe_doc_tokens(doc_tokens: int | tuple[int, int]) -> str:
    return f"{doc_tokens[0]}–{doc_tokens[1]}" if isinstance(doc_tokens, tuple) else f"{doc_tokens}"


def paper_density_bits(layout: PromptLayout, n_layers: int, n_heads: int, tile: int = 64,
                       la_density: float = PAPER_LA_DENSITY, ca_density: float = PAPER_CA_DENSITY,
                       seed: int = 0, dense: frozenset[int] = frozenset()) -> PromptBits:
    """Random bits at the paper's densities: the diagonal always set, other tiles with the probability that makes
    the expected LA tile density `la_density`; each page with probability `ca_density`. Documents in `dense` get
    no bits (not profiled)."""

    def off_diagonal(p: int) -> float:
        total = p * (p + 1) / 2
        return 0.0 if p == 1 else min(1.0, max(0.0, (la_density * total - p) / (total - p)))

    return random_prompt_bits(layout, tile, n_layers, n_heads, off_diagonal, ca_density,
                              np.random.default_rng(seed), dense)[0]


def spread(k: int, n: int) -> frozenset[int]:
    """k of n document indices, evenly spread (the middle one for k = 1)."""
    k = max(0, min(k, n))
    return frozenset(min(n - 1, int((i + 0.5) * n / k)) for i in range(k)) if k else frozenset()


def sampled_bits(layout: PromptLayout, n_layers: int, n_heads: int, sources: list, tile: int, seed: int = 0
                 ) -> PromptBits:
    """Per (document, layer, head), the (layer, head) pattern of a random source document of the same page count.

    sources: DocBits-like objects (la_tiles [L0, H0, P, P], ca_pages [L0, H0, P]) profiled at `tile`."""
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


# ---- cases -----------------------------------------------------------------------------------------------------

def llama_cases(lengths, pattern: str = "paper", doc_tokens: int | tuple[int, int] = 2048, tile: int = 64,
                sources=None, device="cuda", overrides: dict | None = None, seed: int = 0, lm=None,
                prefix_len: int = 16, unprofiled: int = 0):
    """Yield a Case for the 8B-shaped model at each length (the model is built once, or `lm` is reused).
    doc_tokens: one length, or a (lo, hi) range each document's length is drawn from. prefix_len 16 puts no
    document on a 64-token boundary, as in real prompts (blocks follow the documents either way). unprofiled:
    documents of each prompt left without bits (dense), evenly spread; with the paper's pattern only."""
    if lm is None:
        lm = llama3_8b_shaped(device, torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32,
                              overrides, seed)
    g = torch.Generator().manual_seed(seed)
    for L in lengths:
        lay = synthetic_layout(L, doc_tokens, prefix_len, seed=seed + L)
        if unprofiled and pattern != "paper":
            raise SiftError("unprofiled documents go with the paper's pattern")
        if pattern == "paper":
            dense = spread(unprofiled, len(lay.docs))
            bits = paper_density_bits(lay, lm.n_layers, lm.n_heads, tile, seed=seed, dense=dense)
            label = f"drawn at the paper's densities (LA {PAPER_LA_DENSITY:.1%} tiles, CA {PAPER_CA_DENSITY:.1%} pages)"
            if dense:
                label += f", {len(dense)} of {len(lay.docs)} documents unprofiled (dense)"
        elif pattern == "sampled":
            if not sources:
                raise SiftError("pattern 'sampled' needs source profiles")
            bits = sampled_bits(lay, lm.n_layers, lm.n_heads, sources, tile, seed)
            label = f"sampled from real SmolLM2 profiles of {describe_doc_tokens(doc_tokens)}-token documents"
        else:
            raise SiftError(f"pattern {pattern!r}: expected paper or sampled")
        label += f", documents of {describe_doc_tokens(doc_tokens)} tokens, {prefix_len}-token prefix"
        ids = torch.randint(0, lm.config.vocab_size, (L,), generator=g).tolist()
        yield Case(lm, lm.name, label, ids, bits)


def corpus_cases(lengths, corpus_dir, lm, seed: int = 0, suffix_len: int = 32):
    """Yield a Case for the 8B-shaped model at each length whose documents are random documents of the shard set in
    `corpus_dir` (an 8B-shaped set: `store_sets.build_synthetic_set(..., "llama8b")`), their tokens and bits read
    from its serving store; SIFT's timed prefill looks the bits up again there (the lookup inside its TTFT)."""
    import pyarrow.parquet as pq

    from ...shards.format import MANIFEST
    from ...store.bitstore import BitStore

    store = BitStore(corpus_dir)
    if (int(store.meta["sift.n_layers"]), int(store.meta["sift.n_heads"])) != (lm.n_layers, lm.n_heads):
        raise SiftError(f"{corpus_dir}: bits of {store.meta['sift.n_layers']} layers × {store.meta['sift.n_heads']} "
                        f"heads, the model has {lm.n_layers} × {lm.n_heads}")
    manifest = pq.read_table(Path(corpus_dir) / MANIFEST, columns=["doc_id", "n_tokens"])
    ids, sizes = manifest.column("doc_id").to_pylist(), manifest.column("n_tokens").to_numpy()
    rng = np.random.default_rng(seed)
    prefix = store.prefix_token_ids
    for L in lengths:
        body, chosen = L - len(prefix) - suffix_len, []
        for i in rng.permutation(len(ids)):
            if sizes[i] <= body:
                chosen.append(ids[i])
                body -= int(sizes[i])
            if body < sizes.min():
                break
        recs = store.get(chosen)
        suffix = rng.integers(0, lm.config.vocab_size, suffix_len).tolist()
        p = build_prompt(lm, prefix, chosen, [r.tokens for r in recs], [r.la_bits for r in recs],
                         [r.ca_bits for r in recs], store.tile, "bench", allow_long=True, suffix_ids=suffix)
        source = BitsSource(p.layout, (store,) * len(chosen), store.tile, lm.n_layers, lm.n_heads)
        label = (f"bits of {len(chosen)} random documents of a {len(ids):,}-document set "
                 f"({store.meta['sift.model']['name']}), looked up in its serving store inside SIFT's TTFT")
        yield Case(lm, lm.name, label, p.input_ids, p.bits, source)


def essay_token_docs(lm, data, doc_tokens: int, n: int) -> list[list[int]]:
    """The first `doc_tokens` tokens of the first `n` essays long enough (templated as in STUDY.md)."""
    docs = list(render_records(essay_records(data_dir(data), words=10 ** 6)).values())
    toks = [t[:doc_tokens] for t in tokenize_documents(lm.tokenizer, docs) if len(t) >= doc_tokens]
    if not toks:
        raise SiftError(f"no essay has {doc_tokens} tokens")
    return toks[:n]


def real_profiles(lm, docs: list[list[int]], tile: int = 64):
    """DocBits of documents profiled on the spot at the default thresholds."""
    cfg = resolve_profile_config(lm.device, {"tile": tile}).profile
    prefix = prefix_token_ids(lm.tokenizer)
    out = []
    for d in docs:
        out.extend(profile_batch(lm.model, prefix, [d], cfg))
    return prefix, out


def smol_cases(lm, lengths, data=None, doc_tokens: int = 2048, tile: int = 64, question: str = "What is this about?"):
    """SmolLM2 prompts of real essays (cycled when a length needs more), with their real profiles."""
    need = max(1, max(lengths) // doc_tokens + 1)
    docs = essay_token_docs(lm, data, doc_tokens, need)
    prefix, bits = real_profiles(lm, docs, tile)
    packed = [pack_doc(b.la_tiles, b.ca_pages) for b in bits]
    suffix = suffix_token_ids(lm.tokenizer, question)
    for L in lengths:
        body = L - len(prefix) - len(suffix)
        toks, la, ca, names = [], [], [], []
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
        p = build_prompt(lm, prefix, names, toks, la, ca, tile, question, allow_long=True, suffix_ids=suffix)
        note = "real profiles" + (" (past the trained context: speed only)" if L > lm.max_context else "")
        yield Case(lm, lm.name, note, p.input_ids, p.bits)
