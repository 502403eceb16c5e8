"""The read side of a shard directory: metadata and documents by id through the manifest (`ShardSet`), and why an
id is absent (skipped at profile time, with its reason, or never profiled)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from ..errors import SiftError
from .files import ShardFile, list_parts, shared_metadata, skipped_documents
from .format import MANIFEST, decode_metadata, matching_keys, required_keys
from .record import DocRecord, SetMetadata, absent_line, raise_missing


class ShardSet(SetMetadata):
    """Read side of a shard directory: metadata and documents by id through the manifest.

    Opening a set checks what `sift inspect` and `sift validate` check first: every part file was made with the same
    model and settings, and the manifest is theirs (files of different settings mixed in one directory are refused
    here too, not read with the wrong tile size)."""

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
        missing = [k for k in matching_keys() if k not in self.meta and k in required_keys()]
        if missing:
            raise SiftError(f"{manifest}: metadata key {missing[0]} missing; re-run `sift status --finalize`")
        self._index = {d: (f, r) for d, f, r in zip(table.column("doc_id").to_pylist(),
                                                    table.column("file").to_pylist(),
                                                    table.column("row").to_pylist())}
        self.skipped = self._check_parts(manifest)

    def _check_parts(self, manifest: Path) -> dict[str, str]:
        """Refuse part files of other settings and a manifest of other shards; return the documents skipped at
        profile time (doc_id → reason) as the part files record them. Unreadable files are left to the reads
        (and `sift validate`)."""
        files = []
        for p in list_parts(self.dir):
            try:
                files.append(ShardFile.open(p))
            except SiftError:
                continue
        if not files:
            return {}
        shared = shared_metadata(files)
        for key in matching_keys():
            if self.meta.get(key) != shared.get(key):
                raise SiftError(f"{manifest}: {key.removeprefix('sift.')} differs from the part files': the manifest "
                                f"belongs to other shards — run `sift status {self.dir} --finalize` to rewrite it")
        return skipped_documents(files)

    def skip_reason(self, doc_id: str) -> str | None:
        """Why `doc_id` was not profiled when this set was made (None: it was, or the corpus had no such id)."""
        return self.skipped.get(doc_id)

    def absent(self, doc_id: str) -> str:
        """An error line for an id this set does not hold: skipped at profile time (and why), or not in it."""
        return absent_line(self.dir, doc_id, self.skip_reason(doc_id))

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
        raise_missing(self.dir, self.missing(doc_ids), self.absent)
        found = self.records(doc_ids)
        return [found[d] for d in doc_ids]

    def bits(self, doc_ids: list[str]) -> tuple[list[bytes], list[bytes]]:
        """The LA and CA bit vectors of `doc_ids`, in order (as `store.bitstore.BitStore.bits`)."""
        records = self.get(doc_ids)
        return [r.la_bits for r in records], [r.ca_bits for r in records]

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
