"""SIFT metadata bytes against KV-cache bytes (paper Table 1, §4.3, §7.3).

Per (document, layer, query head) SIFT stores `ceil(P(P+1)/2 / 8)` LA bytes and `ceil(P/8)` CA bytes with
`P = ceil(n / T)` (SPEC §4, byte-padded as stored); the KV cache of the same document is
`n · 2 · layers · kv_heads · head_dim · bytes_per_value`. SIFT grows with P² per document but in bits; the
document length at which the two are equal is found by bisection. `paper_bits=True` also gives the unpadded
`P(P+1)/2 + P` bits the paper's arithmetic uses.
"""

from __future__ import annotations

from pathlib import Path

from ...bits import ca_nbytes, la_nbytes, n_pages
from ...errors import SiftError
from ...shards.inspection import inspect_shards


# Published configs: (layers, query heads, KV heads, head_dim). Attention shapes only: that is all both sizes need.
MODELS = {
    "SmolLM2-135M": (30, 9, 3, 64),
    "Llama-3-8B": (32, 32, 8, 128),
    "Llama-3-70B": (80, 64, 8, 128),
    "Llama-3.1-405B": (126, 128, 8, 128),
    "Mistral-7B": (32, 32, 8, 128),
    "Qwen2.5-7B": (28, 28, 4, 128),
    "Qwen3-8B": (36, 32, 8, 128),
    "Qwen3-235B-A22B": (94, 64, 4, 128),
    "MiniMax-M2": (62, 48, 8, 128),
}
DOC_LENGTHS = (128, 512, 1024, 2048, 4096, 8192)


def sift_bytes(n_tokens: int, layers: int, heads: int, tile: int, padded: bool = True) -> float:
    p = n_pages(n_tokens, tile)
    per = (la_nbytes(p) + ca_nbytes(p)) if padded else (p * (p + 1) / 2 + p) / 8
    return layers * heads * per


def kv_bytes(n_tokens: int, layers: int, kv_heads: int, head_dim: int, bytes_per_value: int = 2) -> int:
    return n_tokens * 2 * layers * kv_heads * head_dim * bytes_per_value


def crossover_tokens(layers: int, heads: int, kv_heads: int, head_dim: int, tile: int, bytes_per_value: int = 2,
                     padded: bool = True) -> int:
    """Smallest document length at which SIFT's metadata is at least the KV cache."""
    def ge(n):
        return sift_bytes(n, layers, heads, tile, padded) >= kv_bytes(n, layers, kv_heads, head_dim, bytes_per_value)

    hi = tile
    while not ge(hi):
        hi *= 2
    lo = hi // 2
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if ge(mid):
            hi = mid
        else:
            lo = mid
    return hi


def model_table(models: dict | None = None, doc_lengths=DOC_LENGTHS, tile: int = 64, bytes_per_value: int = 2
                ) -> list[dict]:
    rows = []
    for name, (L, H, Hkv, D) in (models or MODELS).items():
        cross = crossover_tokens(L, H, Hkv, D, tile, bytes_per_value)
        for n in doc_lengths:
            s, k = sift_bytes(n, L, H, tile), kv_bytes(n, L, Hkv, D, bytes_per_value)
            rows.append({"model": name, "layers": L, "heads": H, "kv_heads": Hkv, "head_dim": D, "tile": tile,
                         "doc_tokens": n, "sift_bytes": s, "sift_bytes_unpadded": sift_bytes(n, L, H, tile, False),
                         "kv_bytes": k, "kv_over_sift": k / s, "kv_over_sift_unpadded": k / sift_bytes(n, L, H, tile,
                                                                                                       False),
                         "crossover_doc_tokens": cross})
    return rows


def prompt_table(models: dict | None = None, prompt_tokens=(15360, 32768, 65536), doc_tokens: int = 1024,
                 tile: int = 32, bytes_per_value: int = 2) -> list[dict]:
    """Metadata of one prompt of `prompt_tokens` tokens made of `doc_tokens`-token documents (paper §7: 1.0 /
    2.5 / 4.5 MB at 15K / 32K / 64K for Llama-3-8B), against the KV cache a KV-reuse method would read."""
    rows = []
    for name, (L, H, Hkv, D) in (models or MODELS).items():
        for total in prompt_tokens:
            full, rest = divmod(total, doc_tokens)
            s = full * sift_bytes(doc_tokens, L, H, tile) + (sift_bytes(rest, L, H, tile) if rest else 0)
            k = kv_bytes(total, L, Hkv, D, bytes_per_value)
            rows.append({"model": name, "prompt_tokens": total, "doc_tokens": doc_tokens, "tile": tile,
                         "sift_bytes": s, "kv_bytes": k, "kv_bytes_per_layer": k / L, "kv_over_sift": k / s})
    return rows


def shard_table(path: str | Path) -> dict:
    """The corpus on disk: metadata bytes (bit vectors only, and whole shard files) against its KV cache."""
    s = inspect_shards(path)
    keys = ("path", "documents", "tokens", "tokens_mean", "tokens_max", "tile_size", "n_layers", "n_heads",
            "n_kv_heads", "head_dim", "metadata_bytes", "shard_bytes_on_disk", "kv_cache_bytes_bf16",
            "kv_to_metadata_ratio", "kv_to_disk_ratio", "model")
    out = {k: s[k] for k in keys}
    out["model"] = s["model"].get("name")
    return out


def storage_report(shards: str | Path | None = None, tile: int = 64, doc_lengths=DOC_LENGTHS,
                   models: list[str] | None = None) -> dict:
    """`sift eval storage`: the published configs (`models`: a subset of MODELS) and optionally a shard set."""
    unknown = [m for m in models or () if m not in MODELS]
    if unknown:
        raise SiftError(f"--models: unknown {unknown[0]!r}; known: {', '.join(MODELS)}")
    if tile not in (16, 32, 64, 128, 256):
        raise SiftError("--tile must be a power of two from 16 to 256")
    chosen = {m: MODELS[m] for m in (models or MODELS)}
    out = {"tile": tile, "models": model_table(chosen, doc_lengths, tile),
           "prompts": prompt_table(chosen),
           "paper": {"llama3_8b_ratio": 24000, "llama3_8b_equal_at_tokens": 33.6e6,
                     "llama3_8b_prompt_mb": {"15K": 1.0, "32K": 2.5, "64K": 4.5},
                     "minimax_m25_64k": {"sift_mb": 0.98, "kv_gb": 15.1}}}
    if shards is not None:
        out["shards"] = shard_table(shards)
    return out
