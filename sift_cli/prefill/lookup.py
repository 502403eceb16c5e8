"""The first step of a request: the shard sets a prompt reads, opened once, and its documents' bits fetched from them.

A set with a serving store (`store/`, built by `sift profile` and `sift index`) is opened as a `BitStore`: point
reads, microseconds per document at any set size. A set made before the store existed is read through its
Parquet files (`shards.reader.ShardSet`: each lookup decodes whole part files), with a hint to build the store.
`BitsSource` is the lookup SIFT repeats inside its timed prefill, so a prompt's TTFT counts fetching its bits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import SiftError
from ..layout import PromptBits, PromptLayout
from ..shards.files import list_parts
from ..shards.format import MANIFEST
from ..shards.reader import ShardSet
from ..store.bitstore import BitStore
from ..store.layout import SET_FILE, STORE_DIR


ShardSource = BitStore | ShardSet  # a set a prompt reads: its serving store, or its Parquet files


def has_store(directory: str | Path) -> bool:
    return (Path(directory) / STORE_DIR / SET_FILE).is_file()


def slow_path_hint(directory: str | Path) -> str:
    return (f"{directory} has no serving store: every lookup decodes whole part files (slow at corpus scale); "
            f"build it once with `sift index {directory}`")


def open_set(directory: str | Path, cache_bytes: int = 0) -> ShardSource:
    """The set in `directory`: its serving store when it has one, else its Parquet files through the manifest
    (`slow_path_hint` says how to build the store)."""
    if has_store(directory):
        return BitStore(directory, cache_bytes=cache_bytes)
    check_holds_a_set(directory)
    return ShardSet(directory)


def check_holds_a_set(directory: str | Path) -> None:
    """Refuse, in one line that says what it is, a path that is not a shard set at all (a file, a folder of other
    Parquet files), before the reader's advice for sets not finished yet could mislead."""
    d = Path(directory)
    if d.is_file():
        raise SiftError(f"{d} is a file — give the folder `sift profile --out` wrote (its shard set)")
    if not d.is_dir() or (d / MANIFEST).is_file() or list_parts(d):
        return
    if any(d.glob("*.parquet")):
        raise SiftError(f"{d} holds Parquet files but no sift shard set — profile them as a corpus first "
                        f"(`sift profile {d} --out shards/`) and give that folder")
    raise SiftError(f"{d} holds no sift shard set — give the folder `sift profile --out` wrote")


def shard_sets(shards_dir: str | Path, extra: str | Path | None = None, cache_bytes: int = 0) -> list[ShardSource]:
    """The set a prompt is assembled from, then `extra` (where missing documents are profiled to) once it holds a
    finished set; the first set holding an id wins."""
    sets = [open_set(shards_dir, cache_bytes)]
    if extra is not None and Path(extra).resolve() != Path(shards_dir).resolve() and (
            has_store(extra) or (Path(extra) / MANIFEST).is_file()):
        sets.append(open_set(extra, cache_bytes))
    return sets


def open_sets_timed(shards_dir: str | Path, extra: str | Path | None = None, cache_bytes: int = 0
                    ) -> tuple[list, dict]:
    """`shard_sets`, and what opening them cost: {open_ms, read_path ("store" or "parquet"), hints}."""
    t0 = time.perf_counter()
    sets = shard_sets(shards_dir, extra, cache_bytes)
    open_ms = (time.perf_counter() - t0) * 1e3
    return sets, {"open_ms": open_ms, "read_path": "store" if all(isinstance(s, BitStore) for s in sets)
                  else "parquet", "hints": [slow_path_hint(s.dir) for s in sets if isinstance(s, ShardSet)]}


@dataclass(frozen=True)
class BitsSource:
    """Where a prompt's bits come from at prefill time: per document, the set holding its bits (None: a dense
    document, no bits). `fetch()` looks them up again and packs them as the decoders read them."""

    layout: PromptLayout
    holders: tuple  # per document: a set (BitStore or ShardSet), or None
    tile: int
    n_layers: int
    n_heads: int

    def fetch(self) -> PromptBits:
        la: list = [None] * len(self.holders)
        ca: list = [None] * len(self.holders)
        by_set: dict[int, tuple] = {}
        for d, holder in enumerate(self.holders):
            if holder is not None:
                by_set.setdefault(id(holder), (holder, []))[1].append(d)
        for holder, docs in by_set.values():
            got_la, got_ca = holder.bits([self.layout.docs[d].doc_id for d in docs])
            for d, a, c in zip(docs, got_la, got_ca):
                la[d], ca[d] = a, c
        return PromptBits.pack(self.layout, la, ca, self.tile, self.n_layers, self.n_heads)


def timed_fetch(source: BitsSource | None, bits: PromptBits) -> tuple[PromptBits, float]:
    """The prompt's bits fetched from its sets (`bits` when it has none behind it) and the milliseconds it took."""
    if source is None:
        return bits, 0.0
    t0 = time.perf_counter()
    fetched = source.fetch()
    return fetched, (time.perf_counter() - t0) * 1e3


def check_same_kind(sets: list[ShardSource]) -> None:
    """Every set of a prompt holds one kind of bits (tile, thresholds, prefix)."""
    first = sets[0]
    for s in sets[1:]:
        for key in ("sift.tile_size", "sift.rule", "sift.alpha", "sift.beta", "sift.gamma", "sift.epsilon",
                    "sift.ca_epsilon", "sift.prefix_token_ids"):
            if s.meta.get(key) != first.meta.get(key):
                raise SiftError(f"{s.dir} was profiled with another {key.removeprefix('sift.')} than {first.dir}; "
                                f"prompts read one kind of bits")
