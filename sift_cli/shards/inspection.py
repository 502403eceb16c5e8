"""What `sift inspect` reports: sparsity of a shard file or directory, per layer with the spread across heads,
metadata bytes against the KV cache the same tokens would need, and one document's tile map."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bits import ca_nbytes, la_nbytes, n_pages, n_tiles, unpack_ca, unpack_la
from ..errors import SiftError
from .files import ShardFile, shard_paths, shared_metadata


def _popcounts(blob: bytes, vectors: int, nbytes: int) -> np.ndarray:
    arr = np.frombuffer(blob, dtype=np.uint8).reshape(vectors, nbytes)
    return np.unpackbits(arr, axis=1).sum(1, dtype=np.int64)


def inspect_shards(path: str | Path) -> dict:
    files = [ShardFile.open(p) for p in shard_paths(Path(path))]
    meta = shared_metadata(files)
    L, H, T = int(meta["sift.n_layers"]), int(meta["sift.n_heads"]), int(meta["sift.tile_size"])
    kv_heads, head_dim = int(meta["sift.n_kv_heads"]), int(meta["sift.head_dim"])
    la_set = np.zeros((L, H), dtype=np.int64)
    ca_set = np.zeros((L, H), dtype=np.int64)
    tiles_total = pages_total = tokens = docs = meta_bytes = 0
    lengths = []
    for f in files:
        t = f.read(["n_tokens", "la_bits", "ca_bits"])
        for n, la, ca in zip(t.column("n_tokens").to_pylist(), t.column("la_bits").to_pylist(),
                             t.column("ca_bits").to_pylist()):
            p = n_pages(n, T)
            la_set += _popcounts(la, L * H, la_nbytes(p)).reshape(L, H)
            ca_set += _popcounts(ca, L * H, ca_nbytes(p)).reshape(L, H)
            tiles_total += n_tiles(p)
            pages_total += p
            tokens += n
            docs += 1
            meta_bytes += len(la) + len(ca)
            lengths.append(n)
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
        "tokens_min": min(lengths) if lengths else 0, "tokens_max": max(lengths) if lengths else 0,
        "tokens_mean": tokens / docs if docs else 0.0,
        "tile_size": T, "alpha": meta["sift.alpha"], "beta": meta["sift.beta"], "gamma": meta["sift.gamma"],
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
    """One document's LA tiles [P, P] and CA pages [P] at (layer, head)."""
    for p in shard_paths(Path(path)):
        f = ShardFile.open(p)
        t = f.read(["doc_id", "n_tokens", "la_bits", "ca_bits"])
        ids = t.column("doc_id").to_pylist()
        if doc_id not in ids:
            continue
        row = ids.index(doc_id)
        L, H, T = int(f.meta["sift.n_layers"]), int(f.meta["sift.n_heads"]), int(f.meta["sift.tile_size"])
        if not (0 <= layer < L and 0 <= head < H):
            raise SiftError(f"--layer {layer} --head {head}: the model has {L} layers and {H} heads")
        n = t.column("n_tokens")[row].as_py()
        P = n_pages(n, T)
        lb, cb = la_nbytes(P), ca_nbytes(P)
        k = layer * H + head
        la = t.column("la_bits")[row].as_py()[k * lb:(k + 1) * lb]
        ca = t.column("ca_bits")[row].as_py()[k * cb:(k + 1) * cb]
        return {"doc_id": doc_id, "layer": layer, "head": head, "n_tokens": n, "pages": P, "tile_size": T,
                "la": unpack_la(la, P).astype(int).tolist(), "ca": unpack_ca(ca, P).astype(int).tolist()}
    raise SiftError(f"doc_id {doc_id!r} not found in {path}")


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
