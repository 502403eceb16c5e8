"""One profiled document as the read paths return it (the Parquet reader and the serving store alike), and what
both say of an id a set does not hold."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import SiftError


@dataclass
class DocRecord:
    doc_id: str
    tokens: list[int]
    la_bits: bytes
    ca_bits: bytes


class SetMetadata:
    """What both read paths derive from a set's shared metadata (`self.meta`, the decoded sift.* keys)."""

    meta: dict

    @property
    def tile(self) -> int:
        return int(self.meta["sift.tile_size"])

    @property
    def prefix_token_ids(self) -> list[int]:
        return list(self.meta["sift.prefix_token_ids"])


def absent_line(directory: Path, doc_id: str, reason: str | None) -> str:
    """An error line for an id a set does not hold: skipped at profile time (`reason`), or not in it."""
    if reason is not None:
        return (f"doc_id {doc_id!r} was skipped when {directory} was profiled: {reason} — leave it out of the "
                f"prompt, or fix or split the document and profile it again")
    return (f"doc_id {doc_id!r} is not in the shard set {directory} — check the id (`sift ids {directory}` lists "
            f"them) or profile the document first")


def raise_missing(directory: Path, missing: list[str], absent: Callable[[str], str]) -> None:
    """One error line for one missing id; for several, one line and each id's under it."""
    if len(missing) == 1:
        raise SiftError(absent(missing[0]))
    if missing:
        raise SiftError(f"{len(missing)} doc_ids are absent from the shard set {directory} — see below why; "
                        f"`sift ids {directory}` lists the set's ids", [absent(d) for d in missing])
