"""Shard sets of any size for the store benchmarks, written through the project's own writer
(`shards.files.write_shard`, then `shards.manifest.write_manifest`), with the shapes of real models.

Documents get random token ids and random valid bits (diagonal tiles set, padding zero) at about the paper's
densities; lengths are drawn uniformly in a range. Nothing depends on a model or its weights: a lookup's cost
depends on the bytes of the set, which the shape fixes. Buckets are written by worker processes.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import __version__
from ...bits import ca_nbytes, la_nbytes, n_pages, n_tiles
from ...shards.files import write_shard
from ...shards.format import FORMAT_VERSION, part_name, shard_of, token_sha256
from ...shards.manifest import write_manifest
from .store_probe import doc_id


@dataclass(frozen=True)
class SetShape:
    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    tile: int = 64
    vocab: int = 49152
    max_context: int = 8192


SHAPES = {
    "smollm2": SetShape("SmolLM2-135M-shaped (synthetic bits)", 30, 9, 3, 64, 64, 49152, 8192),
    "llama8b": SetShape("Llama-3-8B-shaped (synthetic bits)", 32, 32, 8, 128, 64, 128256, 131072),
}


def set_metadata(shape: SetShape, num_shards: int) -> dict:
    return {"sift.format_version": FORMAT_VERSION,
            "sift.model": {"name": shape.name, "source": "synthetic", "config_hash": f"synthetic-{shape.n_layers}x"
                           f"{shape.n_heads}x{shape.head_dim}", "weights": "synthetic", "dtype": "bfloat16"},
            "sift.n_layers": shape.n_layers, "sift.n_heads": shape.n_heads, "sift.n_kv_heads": shape.n_kv_heads,
            "sift.head_dim": shape.head_dim, "sift.tile_size": shape.tile, "sift.alpha": 0.001, "sift.beta": 0.01,
            "sift.gamma": 0.1, "sift.prefix_token_ids": [1, 2, 3], "sift.tokenizer": {"class": "synthetic",
                                                                                     "vocab_size": shape.vocab},
            "sift.tool_version": __version__, "sift.num_shards": num_shards, "sift.max_context": shape.max_context}


@functools.lru_cache(maxsize=None)
def _masks(pages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(LA bytes with the diagonal tiles set, LA bytes' valid bits, CA bytes' valid bits) of a P-page vector."""
    tiles = n_tiles(pages)
    diag = np.zeros(la_nbytes(pages) * 8, dtype=np.uint8)
    diag[[r * (r + 1) // 2 + r for r in range(pages)]] = 1
    valid = np.zeros(la_nbytes(pages) * 8, dtype=np.uint8)
    valid[:tiles] = 1
    ca_valid = np.zeros(ca_nbytes(pages) * 8, dtype=np.uint8)
    ca_valid[:pages] = 1
    return np.packbits(diag), np.packbits(valid), np.packbits(ca_valid)


def synthetic_row(i: int, shape: SetShape, lengths: tuple[int, int], seed: int) -> dict:
    """Document i: random tokens, and LA/CA bits set with probability ~1/4 (diagonal tiles always, padding zero)."""
    rng = np.random.default_rng([seed, i])
    n = int(rng.integers(lengths[0], lengths[1] + 1))
    tokens = rng.integers(0, shape.vocab, n, dtype=np.int32)
    p = n_pages(n, shape.tile)
    diag, valid, ca_valid = _masks(p)
    vectors = shape.n_layers * shape.n_heads
    la = rng.integers(0, 256, (vectors, la_nbytes(p)), dtype=np.uint8) & rng.integers(0, 256, (vectors, 1),
                                                                                       dtype=np.uint8)
    la = ((la & rng.integers(0, 256, la.shape, dtype=np.uint8)) | diag) & valid
    ca = rng.integers(0, 256, (vectors, ca_nbytes(p)), dtype=np.uint8)
    ca = ca & rng.integers(0, 256, ca.shape, dtype=np.uint8) & ca_valid
    la_set = int(np.bitwise_count(la).sum())
    ca_set = int(np.bitwise_count(ca).sum())
    return {"doc_id": doc_id(i), "tokens": tokens.tolist(), "token_sha256": token_sha256(tokens), "n_tokens": n,
            "la_bits": la.tobytes(), "ca_bits": ca.tobytes(), "la_density": la_set / (vectors * n_tiles(p)),
            "ca_density": ca_set / (vectors * p)}


def _write_buckets(out: str, buckets: list[int], members: dict, shape: SetShape, lengths, seed: int,
                   num_shards: int) -> int:
    meta = set_metadata(shape, num_shards)
    written = 0
    for s in buckets:
        rows = [synthetic_row(i, shape, lengths, seed) for i in members.get(s, [])]
        write_shard(Path(out) / part_name(s), rows, {**meta, "sift.shard_index": s, "sift.skipped": [],
                                                     "sift.skip_reasons": {}})
        written += len(rows)
    return written


def build_synthetic_set(out: str | Path, n_docs: int, shape: str | SetShape = "smollm2",
                        docs_per_shard: int = 1000, lengths: tuple[int, int] = (100, 1500), workers: int = 1,
                        seed: int = 0) -> dict:
    """A finished shard set of `n_docs` synthetic documents in `out` (with its manifest and serving store);
    buckets already written are kept (a rerun finishes an interrupted build). Returns {path, documents, buckets}."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    num_shards = max(1, -(-n_docs // docs_per_shard))
    members: dict[int, list[int]] = {}
    for i in range(n_docs):
        members.setdefault(shard_of(doc_id(i), num_shards), []).append(i)
    todo = [s for s in range(num_shards) if not (out / part_name(s)).is_file()]
    chunks = [todo[k::max(1, workers)] for k in range(max(1, workers))]
    chunks = [c for c in chunks if c]
    if workers > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(len(chunks)) as pool:
            list(pool.map(_write_buckets, [str(out)] * len(chunks), chunks,
                          [{s: members.get(s, []) for s in c} for c in chunks], [shape] * len(chunks),
                          [lengths] * len(chunks), [seed] * len(chunks), [num_shards] * len(chunks)))
    elif chunks:
        _write_buckets(str(out), chunks[0], members, shape, lengths, seed, num_shards)
    write_manifest(out)
    return {"path": str(out), "documents": n_docs, "buckets": num_shards, "shape": shape.name,
            "bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file())}


def default_workers() -> int:
    return max(1, (os.cpu_count() or 1))
