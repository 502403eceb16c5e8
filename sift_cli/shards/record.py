"""One profiled document as the read paths return it (the Parquet reader and the serving store alike)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DocRecord:
    doc_id: str
    tokens: list[int]
    la_bits: bytes
    ca_bits: bytes
