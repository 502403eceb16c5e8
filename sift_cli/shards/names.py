"""Names in a shard directory and the hash that assigns a document to its bucket: what every reader needs, with no
dependency beyond the standard library (the serving store's read path imports nothing heavier)."""

from __future__ import annotations

import hashlib

MANIFEST = "manifest.parquet"
PART_GLOB = "part-*.parquet"


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def part_index(name: str) -> int:
    """The bucket index of a part file's name (`part_name`'s inverse; also of a name with more suffixes, as
    `part-00003.parquet.unreadable`); ValueError for another name."""
    return int(name.removeprefix("part-").split(".", 1)[0])


def doc_key(doc_id: str) -> int:
    """The document's 64-bit key: the first 8 bytes of sha256(doc_id), big-endian. Its bucket is the key modulo the
    set's bucket count (`shard_of`); the serving store sorts a bucket's documents by it."""
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big")


def shard_of(doc_id: str, num_shards: int) -> int:
    """Deterministic bucket of a doc_id: independent of worker count, order and machine."""
    return doc_key(doc_id) % num_shards
