"""What `sift inspect` reports: sparsity of a shard file or directory, per layer with the spread across heads,
metadata bytes against the KV cache the same tokens would need, and one document's tile map."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..bits import ca_nbytes, la_nbytes, n_pages, unpack_ca, unpack_la
from ..cpu_memory import keep_freed_memory
from ..errors import SiftError
from ..store.bitstore import BitStore
from ..store.layout import SET_FILE, STORE_DIR
from .columns import binary_column, gather_rows, row_chunks
from .files import ShardFile, shard_paths, shared_metadata


@dataclass
class FileStats:
    """One part file's share of `inspect_shards`: set bits per (layer, head), tiles, pages, tokens, documents."""
    la_set: np.ndarray  # int64 [L * H]
    ca_set: np.ndarray
    tiles: int = 0
    pages: int = 0
    tokens: int = 0
    documents: int = 0
    meta_bytes: int = 0
    lengths_min: int | None = None
    lengths_max: int | None = None


def file_stats(path: str, vectors: int, tile: int) -> FileStats:
    """Popcounts of one file, rows grouped by page count and counted as byte arrays (no Python per row)."""
    keep_freed_memory()  # each file's buffers reuse the last one's pages instead of faulting fresh ones
    table = ShardFile.open(Path(path)).read(["n_tokens", "la_bits", "ca_bits"])
    n = table.column("n_tokens").to_numpy().astype(np.int64)
    stats = FileStats(np.zeros(vectors, np.int64), np.zeros(vectors, np.int64))
    if not len(n):
        return stats
    pages = -(-n // tile)
    stats.tiles, stats.pages = int((pages * (pages + 1) // 2).sum()), int(pages.sum())
    stats.tokens, stats.documents = int(n.sum()), len(n)
    stats.lengths_min, stats.lengths_max = int(n.min()), int(n.max())
    for name, nbytes, total in (("la", la_nbytes, stats.la_set), ("ca", ca_nbytes, stats.ca_set)):
        data, offs = binary_column(table.column(f"{name}_bits"))
        stats.meta_bytes += int(offs[-1] - offs[0])
        for p in np.unique(pages):
            width = nbytes(int(p))
            for rows in row_chunks(np.nonzero(pages == p)[0], vectors * width):
                block = gather_rows(data, offs[rows], vectors * width).reshape(len(rows), vectors, width)
                total += np.bitwise_count(block).sum(axis=(0, 2), dtype=np.int64)
    return stats


def inspect_shards(path: str | Path, workers: int = 1) -> dict:
    files = [ShardFile.open(p) for p in shard_paths(Path(path))]
    meta = shared_metadata(files)
    L, H, T = int(meta["sift.n_layers"]), int(meta["sift.n_heads"]), int(meta["sift.tile_size"])
    kv_heads, head_dim = int(meta["sift.n_kv_heads"]), int(meta["sift.head_dim"])
    names = [str(f.path) for f in files]
    if workers > 1 and len(files) > 1:
        with ProcessPoolExecutor(min(workers, len(files))) as pool:
            parts = list(pool.map(file_stats, names, [L * H] * len(names), [T] * len(names), chunksize=4))
    else:
        parts = [file_stats(n, L * H, T) for n in names]
    la_set = sum(p.la_set for p in parts).reshape(L, H)
    ca_set = sum(p.ca_set for p in parts).reshape(L, H)
    tiles_total, pages_total = sum(p.tiles for p in parts), sum(p.pages for p in parts)
    tokens, docs, meta_bytes = sum(p.tokens for p in parts), sum(p.documents for p in parts), \
        sum(p.meta_bytes for p in parts)
    lows = [p.lengths_min for p in parts if p.documents]
    highs = [p.lengths_max for p in parts if p.documents]
    la_d = la_set / max(1, tiles_total)
    ca_d = ca_set / max(1, pages_total)
    kv_bytes = tokens * 2 * L * kv_heads * head_dim * 2  # K and V, bf16
    disk = sum(f.path.stat().st_size for f in files)
    per_layer = [{"layer": layer,
                  "la_density": float(la_d[layer].mean()), "la_min": float(la_d[layer].min()),
                  "la_max": float(la_d[layer].max()), "la_std": float(la_d[layer].std()),
                  "ca_density": float(ca_d[layer].mean()), "ca_min": float(ca_d[layer].min()),
                  "ca_max": float(ca_d[layer].max()), "ca_std": float(ca_d[layer].std())} for layer in range(L)]
    return {
        "path": str(path), "files": len(files), "documents": docs, "tokens": tokens,
        "tokens_min": min(lows) if lows else 0, "tokens_max": max(highs) if highs else 0,
        "tokens_mean": tokens / docs if docs else 0.0,
        "tile_size": T, "rule": meta.get("sift.rule") or "paper", "alpha": meta["sift.alpha"],
        "beta": meta["sift.beta"], "gamma": meta["sift.gamma"], "epsilon": meta.get("sift.epsilon"),
        "ca_epsilon": meta.get("sift.ca_epsilon"),
        "model": meta["sift.model"], "n_layers": L, "n_heads": H, "n_kv_heads": kv_heads, "head_dim": head_dim,
        "tiles": int(tiles_total) * L * H, "pages": int(pages_total) * L * H,
        "la_density": float(la_set.sum() / max(1, tiles_total * L * H)),
        "ca_density": float(ca_set.sum() / max(1, pages_total * L * H)),
        "per_layer": per_layer,
        "metadata_bytes": int(meta_bytes), "shard_bytes_on_disk": int(disk), "kv_cache_bytes_bf16": int(kv_bytes),
        "kv_to_metadata_ratio": kv_bytes / meta_bytes if meta_bytes else None,
        "kv_to_disk_ratio": kv_bytes / disk if disk else None,
        "bytes_per_document": disk / docs if docs else None,
    }


def tile_map(path: str | Path, doc_id: str, layer: int, head: int) -> dict:
    """One document's LA tiles [P, P] and CA pages [P] at (layer, head): a point read where the set has a serving
    store, else a scan of its part files."""
    if (Path(path) / STORE_DIR / SET_FILE).is_file():
        return _tile_map_from_store(Path(path), doc_id, layer, head)
    for p in shard_paths(Path(path)):
        f = ShardFile.open(p)
        t = f.read(["doc_id", "n_tokens", "la_bits", "ca_bits"])
        ids = t.column("doc_id").to_pylist()
        if doc_id not in ids:
            continue
        row = ids.index(doc_id)
        L, H, T = int(f.meta["sift.n_layers"]), int(f.meta["sift.n_heads"]), int(f.meta["sift.tile_size"])
        return _map_of(doc_id, layer, head, L, H, T, t.column("n_tokens")[row].as_py(),
                       t.column("la_bits")[row].as_py(), t.column("ca_bits")[row].as_py())
    raise SiftError(f"doc_id {doc_id!r} not found in {path}")


def _tile_map_from_store(directory: Path, doc_id: str, layer: int, head: int) -> dict:
    store = BitStore(directory)
    rec = store.record(doc_id)
    if rec is None:
        raise SiftError(f"doc_id {doc_id!r} not found in {directory}")
    L, H, T = int(store.meta["sift.n_layers"]), int(store.meta["sift.n_heads"]), store.tile
    return _map_of(doc_id, layer, head, L, H, T, len(rec.tokens) // 4, rec.la_bits, rec.ca_bits)


def _map_of(doc_id: str, layer: int, head: int, L: int, H: int, T: int, n: int, la_bits: bytes, ca_bits: bytes
            ) -> dict:
    if not (0 <= layer < L and 0 <= head < H):
        raise SiftError(f"--layer {layer} --head {head}: the model has {L} layers and {H} heads")
    P = n_pages(n, T)
    lb, cb = la_nbytes(P), ca_nbytes(P)
    k = layer * H + head
    return {"doc_id": doc_id, "layer": layer, "head": head, "n_tokens": n, "pages": P, "tile_size": T,
            "la": unpack_la(la_bits[k * lb:(k + 1) * lb], P).astype(int).tolist(),
            "ca": unpack_ca(ca_bits[k * cb:(k + 1) * cb], P).astype(int).tolist()}


def draw_tile_map(tm: dict, max_pages: int = 96) -> str:
    """Lower-triangular tile map as text: █ computed, · skipped; the CA row underneath."""
    la, ca, P = tm["la"], tm["ca"], tm["pages"]
    shown = min(P, max_pages)
    lines = [f"{tm['doc_id']}  layer {tm['layer']} head {tm['head']}  {tm['n_tokens']} tokens, "
             f"{P} pages of {tm['tile_size']}" + (f" (first {shown} shown)" if shown < P else "")]
    for r in range(shown):
        lines.append(f"{r:>4} " + "".join("█" if la[r][c] else "·" for c in range(r + 1)))
    lines.append("  CA " + "".join("█" if ca[c] else "·" for c in range(shown)))
    return "\n".join(lines)
