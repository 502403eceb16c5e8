"""The read side of a shard directory: metadata and documents by id through the manifest (`ShardSet`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from ..errors import SiftError
from .files import ShardFile
from .format import MANIFEST, decode_metadata, matching_keys


@dataclass
class DocRecord:
    doc_id: str
    tokens: list[int]
    la_bits: bytes
    ca_bits: bytes


class ShardSet:
    """Read side of a shard directory: metadata and documents by id through the manifest."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise SiftError(f"shard directory not found: {directory}")
        manifest = self.dir / MANIFEST
        if not manifest.is_file():
            raise SiftError(f"{self.dir}: no {MANIFEST}; run `sift profile` to completion (or `sift status "
                            f"{self.dir} --finalize`) first")
        try:
            table = pq.read_table(manifest)
        except Exception as exc:
            raise SiftError(f"{manifest}: unreadable ({str(exc).splitlines()[0]})") from exc
        self.meta = decode_metadata(table.schema.metadata)
        missing = [k for k in matching_keys() if k not in self.meta]
        if missing:
            raise SiftError(f"{manifest}: metadata key {missing[0]} missing; re-run `sift status --finalize`")
        self._index = {d: (f, r) for d, f, r in zip(table.column("doc_id").to_pylist(),
                                                    table.column("file").to_pylist(),
                                                    table.column("row").to_pylist())}

    @property
    def tile(self) -> int:
        return int(self.meta["sift.tile_size"])

    @property
    def prefix_token_ids(self) -> list[int]:
        return list(self.meta["sift.prefix_token_ids"])

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._index

    def __len__(self) -> int:
        return len(self._index)

    def doc_ids(self) -> list[str]:
        return list(self._index)

    def missing(self, doc_ids: list[str]) -> list[str]:
        """The ids of `doc_ids` this set lacks, in order."""
        return [d for d in doc_ids if d not in self._index]

    def get(self, doc_ids: list[str]) -> list[DocRecord]:
        missing = self.missing(doc_ids)
        if missing:
            raise SiftError(f"doc_id {missing[0]!r} is not in the shard set {self.dir}"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        found = self.records(doc_ids)
        return [found[d] for d in doc_ids]

    def records(self, doc_ids: list[str]) -> dict[str, DocRecord]:
        """The records of the ids of `doc_ids` this set holds (the others are left out)."""
        by_file: dict[str, list[int]] = {}
        for d in doc_ids:
            if d not in self._index:
                continue
            f, r = self._index[d]
            by_file.setdefault(f, []).append(r)
        found: dict[str, DocRecord] = {}
        for fname, rows in by_file.items():
            shard = ShardFile.open(self.dir / fname)
            table = shard.read(["doc_id", "tokens", "la_bits", "ca_bits"]).take(sorted(set(rows)))
            for rec in table.to_pylist():
                found[rec["doc_id"]] = DocRecord(rec["doc_id"], rec["tokens"], rec["la_bits"], rec["ca_bits"])
        for d in doc_ids:
            if d in self._index and d not in found:
                raise SiftError(f"{self.dir}: manifest points {d!r} at a row that holds another document; "
                                f"run `sift validate {self.dir}`")
        return found
