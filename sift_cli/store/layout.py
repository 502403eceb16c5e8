"""The serving store's files (docs/shard-format.md, "The serving store"): one bucket file per part file,
`store/part-NNNNN.sbits`, holding that part's documents as uncompressed records behind a table of 64-bit keys
sorted for binary search, and `store/set.json`, the set's shared metadata. Encoding and parsing only: standard
library and numpy, so a reader opens and searches a file without Arrow or torch.

A bucket file, little-endian, every section 8-byte aligned:

    header  64 bytes  magic "SIFTSBIT", version, documents n, where the sections lie, their CRC-32s
    meta    JSON      the bucket's index, the fingerprint of the part file it was built from, the set's digest,
                      the documents skipped at profile time with their reasons
    keys    u64[n]    `shards.names.doc_key` of each document, ascending
    offsets u64[n+1]  where each document's record starts, in key order; offsets[n] is the file's size
    records           per document: id_len, n_tokens, la_len, ca_len, crc (u32 each) and 4 zero bytes, then the
                      id (UTF-8, padded to 4 bytes), the tokens (int32), la_bits, ca_bits, padded to 8 bytes; crc is
                      the CRC-32 of the four lengths and everything after the record's 24-byte header
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..shards.names import doc_key

STORE_DIR = "store"
SET_FILE = "set.json"
SUFFIX = ".sbits"
MAGIC = b"SIFTSBIT"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQQQII")  # magic, version, 0, n, meta_off, meta_len, keys_off, offs_off, table, header
RECORD = struct.Struct("<IIIIII")  # id_len, n_tokens, la_len, ca_len, crc, 0
_PAR1_TAIL = 8  # a Parquet file ends with its footer's length (u32) and b"PAR1"


class StoreDamage(Exception):
    """A store file that does not hold what it says (wrong magic, version, size or checksum)."""


def bucket_file_name(shard: int) -> str:
    return f"part-{shard:05d}{SUFFIX}"


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def set_digest(meta: dict) -> str:
    """sha256 of the set's shared metadata as canonical JSON: every bucket file names the set it belongs to."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode("utf-8")).hexdigest()


def part_fingerprint(path: Path) -> dict:
    """What a bucket file records of the part file it was built from: its size and the sha256 of its Parquet
    footer (the file's metadata, with every column chunk's size, offset and statistics). Reads the file's last
    few kilobytes only."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 12:
            return {"bytes": size, "footer_sha256": None}
        f.seek(size - _PAR1_TAIL)
        tail = f.read(_PAR1_TAIL)
        footer_len = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or footer_len > size - 12:
            return {"bytes": size, "footer_sha256": None}
        f.seek(size - _PAR1_TAIL - footer_len)
        footer = f.read(footer_len)
    return {"bytes": size, "footer_sha256": hashlib.sha256(footer + tail).hexdigest()}


def encode_bucket(doc_ids: list[str], tokens: list, la: list, ca: list, meta: dict, keys: list[int] | None = None
                  ) -> bytes:
    """A bucket file's bytes. tokens: each document's token ids as int32 little-endian bytes (or anything
    `np.asarray(..., "<i4")` takes); la, ca: its bit vectors (bytes-like); keys: the ids' `doc_key`s when the caller
    has them."""
    ids = [d.encode("utf-8") for d in doc_ids]
    toks = [t if isinstance(t, (bytes, bytearray, memoryview)) else np.asarray(t, dtype="<i4").tobytes()
            for t in tokens]
    keys = keys if keys is not None else [doc_key(d) for d in doc_ids]
    order = sorted(range(len(ids)), key=lambda i: (keys[i], ids[i]))
    meta_bytes = json.dumps(meta, sort_keys=True).encode("utf-8")
    n = len(ids)
    meta_off = HEADER.size
    keys_off = meta_off + _pad(len(meta_bytes), 8)
    offs_off = keys_off + 8 * n
    pos = offs_off + 8 * (n + 1)
    offsets = np.empty(n + 1, dtype="<u8")
    records: list = []  # the records' pieces, joined once
    zeros = bytes(8)
    for k, i in enumerate(order):
        pad_id = _pad(len(ids[i]), 4) - len(ids[i])
        size = RECORD.size + len(ids[i]) + pad_id + len(toks[i]) + len(la[i]) + len(ca[i])
        rec = bytearray(b"".join((struct.pack("<IIIIII", len(ids[i]), len(toks[i]) // 4, len(la[i]), len(ca[i]), 0,
                                              0), ids[i], zeros[:pad_id], toks[i], la[i], ca[i],
                                  zeros[: _pad(size, 8) - size])))
        view = memoryview(rec)
        struct.pack_into("<I", rec, 16, zlib.crc32(view[RECORD.size:size], zlib.crc32(view[:16])))
        records.append(rec)
        offsets[k] = pos
        pos += len(rec)
    offsets[n] = pos
    table = (meta_bytes + zeros[: keys_off - meta_off - len(meta_bytes)]
             + np.array([keys[i] for i in order], dtype="<u8").tobytes() + offsets.tobytes())
    table_crc = zlib.crc32(table)
    head = HEADER.pack(MAGIC, VERSION, 0, n, meta_off, len(meta_bytes), keys_off, offs_off, table_crc, 0)
    head = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
    return b"".join([head, table, *records])


@dataclass
class Record:
    doc_id: str
    tokens: bytes  # int32 little-endian
    la_bits: bytes
    ca_bits: bytes

    def token_list(self) -> list[int]:
        return np.frombuffer(self.tokens, dtype="<i4").tolist()


def table_end(header: bytes) -> int:
    """Where a bucket file's table ends (its records begin), from its first 64 bytes."""
    n, offs_off = HEADER.unpack_from(header, 0)[3], HEADER.unpack_from(header, 0)[7]
    return offs_off + 8 * (n + 1)


class BucketView:
    """A bucket file parsed: the header and table checked (from `table`: at least the file's bytes up to its
    records, an mmap or bytes), records found by id and read with `read(offset, length)` (default: from `table`,
    then the whole file), their checksums verified.

    `touched`: the bytes parsing read (header, meta and table, whose checksum covers them); `lookup` and `record`
    return the bytes they read besides (the key probes, then each candidate record whole)."""

    def __init__(self, table, name: str = "bucket file", size: int | None = None, read=None):
        self.name = name
        self.size = len(table) if size is None else size
        self.read = read or (lambda o, n: bytes(table[o: o + n]))
        if len(table) < HEADER.size:
            raise StoreDamage(f"{name}: {len(table)} bytes, shorter than its header")
        (magic, version, _, n, meta_off, meta_len, keys_off, offs_off, table_crc,
         header_crc) = HEADER.unpack_from(table, 0)
        if magic != MAGIC:
            raise StoreDamage(f"{name}: not a sift store file")
        if version != VERSION:
            raise StoreDamage(f"{name}: store format version {version}, this sift reads version {VERSION}")
        if zlib.crc32(memoryview(table)[: HEADER.size - 4]) != header_crc:
            raise StoreDamage(f"{name}: header checksum mismatch")
        end_table = offs_off + 8 * (n + 1)
        if end_table > min(len(table), self.size) or meta_off + meta_len > keys_off:
            raise StoreDamage(f"{name}: sections run past the file's {self.size} bytes")
        if zlib.crc32(memoryview(table)[meta_off:end_table]) != table_crc:
            raise StoreDamage(f"{name}: table checksum mismatch")
        self.n = n
        self.keys = np.frombuffer(table, dtype="<u8", count=n, offset=keys_off)
        self.offsets = np.frombuffer(table, dtype="<u8", count=n + 1, offset=offs_off)
        if int(self.offsets[n]) != self.size:
            raise StoreDamage(f"{name}: {self.size} bytes where its table says {int(self.offsets[n])} (truncated?)")
        self.meta = json.loads(bytes(table[meta_off: meta_off + meta_len]))
        self.touched = end_table  # opening reads the header and the whole table once (checksum)

    def lookup(self, doc_id: str, key: int | None = None) -> tuple[Record | None, int]:
        """(`doc_id`'s record, its checksum verified, or None; the bytes read): one read per candidate record."""
        key = doc_key(doc_id) if key is None else key
        i = int(np.searchsorted(self.keys, np.uint64(key)))
        read = 8 * max(1, self.n.bit_length()) + 16
        while i < self.n and int(self.keys[i]) == key:
            rec, raw = self._parse(i)
            read += raw
            if rec.doc_id == doc_id:
                return rec, read
            if doc_key(rec.doc_id) != key:  # not another id of the same key: damage
                raise StoreDamage(f"{self.name}: record {i} does not hold the document its key names")
            i += 1
        return None, read

    def record(self, i: int) -> tuple[Record, int]:
        """(record i, its checksum verified; the bytes read)."""
        return self._parse(i)

    def _parse(self, i: int) -> tuple[Record, int]:
        o, end = int(self.offsets[i]), int(self.offsets[i + 1])
        raw = self.read(o, end - o)
        if len(raw) < RECORD.size:
            raise StoreDamage(f"{self.name}: record {i} is cut short")
        id_len, n_tokens, la_len, ca_len, crc, _ = RECORD.unpack_from(raw, 0)
        stop = RECORD.size + _pad(id_len, 4) + 4 * n_tokens + la_len + ca_len
        if stop > len(raw):
            raise StoreDamage(f"{self.name}: record {i} runs past its end")
        view = memoryview(raw)
        if zlib.crc32(view[RECORD.size:stop], zlib.crc32(view[:16])) != crc:
            raise StoreDamage(f"{self.name}: record {i} checksum mismatch")
        p = RECORD.size + _pad(id_len, 4)
        tokens = bytes(view[p: p + 4 * n_tokens])
        p += 4 * n_tokens
        rec = Record(bytes(view[RECORD.size: RECORD.size + id_len]).decode("utf-8", "replace"), tokens,
                     bytes(view[p: p + la_len]), bytes(view[p + la_len: stop]))
        return rec, len(raw)

    def records(self):
        """Every record, in key order."""
        for i in range(self.n):
            yield self.record(i)[0]

    def verify(self) -> None:
        """StoreDamage unless every record's checksum holds and its id has the key the table gives it."""
        for i, rec in enumerate(self.records()):
            if doc_key(rec.doc_id) != int(self.keys[i]):
                raise StoreDamage(f"{self.name}: record {i} does not hold the document its key names")
