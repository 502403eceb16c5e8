"""The shard sets a prompt reads its documents' token ids and bits from."""

from __future__ import annotations

from pathlib import Path

from ..shards.format import MANIFEST
from ..shards.reader import ShardSet


def shard_sets(shards_dir: str | Path, extra: str | Path | None = None) -> list[ShardSet]:
    """The set a prompt is assembled from, then `extra` (where missing documents are profiled to) once it has a
    manifest; the first set holding an id wins."""
    sets = [ShardSet(shards_dir)]
    if extra is not None and (Path(extra) / MANIFEST).is_file() and Path(extra).resolve() != sets[0].dir.resolve():
        sets.append(ShardSet(extra))
    return sets
