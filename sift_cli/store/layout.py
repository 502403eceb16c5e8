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


def encode_bucket(doc_ids: list[str], tokens: list, la: list, ca: list, meta: dict) -> bytearray:
    """A bucket file's bytes. tokens: each document's token ids as int32 little-endian bytes (or anything
    `np.asarray(..., "<i4")` takes); la, ca: its bit vectors (bytes-like)."""
    ids = [d.encode("utf-8") for d in doc_ids]
    toks = [t if isinstance(t, (bytes, bytearray, memoryview)) else np.asarray(t, dtype="<i4").tobytes()
            for t in tokens]
    keys = np.array([doc_key(d) for d in doc_ids], dtype=np.uint64)
    order = sorted(range(len(ids)), key=lambda i: (int(keys[i]), ids[i]))
    meta_bytes = json.dumps(meta, sort_keys=True).encode("utf-8")
    n = len(ids)
    meta_off = HEADER.size
    keys_off = meta_off + _pad(len(meta_bytes), 8)
    offs_off = keys_off + 8 * n
    pos = offs_off + 8 * (n + 1)
    offsets = np.empty(n + 1, dtype="<u8")
    sizes = []
    for k, i in enumerate(order):
        size = RECORD.size + _pad(len(ids[i]), 4) + len(toks[i]) + len(la[i]) + len(ca[i])
        offsets[k] = pos
        sizes.append(size)
        pos += _pad(size, 8)
    offsets[n] = pos
    buf = bytearray(pos)
    buf[meta_off: meta_off + len(meta_bytes)] = meta_bytes
    buf[keys_off: offs_off] = keys[order].astype("<u8").tobytes()
    buf[offs_off: offs_off + 8 * (n + 1)] = offsets.tobytes()
    for k, i in enumerate(order):
        o = int(offsets[k])
        lengths = struct.pack("<IIII", len(ids[i]), len(toks[i]) // 4, len(la[i]), len(ca[i]))
        body = o + RECORD.size
        p = body
        for part in (ids[i], b"\0" * (_pad(len(ids[i]), 4) - len(ids[i])), toks[i], la[i], ca[i]):
            buf[p: p + len(part)] = part
            p += len(part)
        crc = zlib.crc32(memoryview(buf)[body:p], zlib.crc32(lengths))
        buf[o: o + RECORD.size] = lengths + struct.pack("<II", crc, 0)
    table_crc = zlib.crc32(memoryview(buf)[meta_off: offs_off + 8 * (n + 1)])
    head = HEADER.pack(MAGIC, VERSION, 0, n, meta_off, len(meta_bytes), keys_off, offs_off, table_crc, 0)
    buf[:HEADER.size] = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
    return buf


@dataclass
class Record:
    doc_id: str
    tokens: bytes  # int32 little-endian
    la_bits: bytes
    ca_bits: bytes

    def token_list(self) -> list[int]:
        return np.frombuffer(self.tokens, dtype="<i4").tolist()


class BucketView:
    """A bucket file's bytes (an mmap, or bytes) parsed: the header and table checked, records found by id.

    `touched`: the bytes parsing read (header, meta and table, whose checksum covers them); `find` and `record`
    return the bytes they read besides (the key probes, offsets and record headers, the record)."""

    def __init__(self, buf, name: str = "bucket file"):
        self.buf, self.name = buf, name
        if len(buf) < HEADER.size:
            raise StoreDamage(f"{name}: {len(buf)} bytes, shorter than its header")
        (magic, version, _, n, meta_off, meta_len, keys_off, offs_off, table_crc,
         header_crc) = HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise StoreDamage(f"{name}: not a sift store file")
        if version != VERSION:
            raise StoreDamage(f"{name}: store format version {version}, this sift reads version {VERSION}")
        if zlib.crc32(memoryview(buf)[: HEADER.size - 4]) != header_crc:
            raise StoreDamage(f"{name}: header checksum mismatch")
        end_table = offs_off + 8 * (n + 1)
        if end_table > len(buf) or meta_off + meta_len > keys_off:
            raise StoreDamage(f"{name}: sections run past the file's {len(buf)} bytes")
        if zlib.crc32(memoryview(buf)[meta_off:end_table]) != table_crc:
            raise StoreDamage(f"{name}: table checksum mismatch")
        self.n = n
        self.keys = np.frombuffer(buf, dtype="<u8", count=n, offset=keys_off)
        self.offsets = np.frombuffer(buf, dtype="<u8", count=n + 1, offset=offs_off)
        if int(self.offsets[n]) != len(buf):
            raise StoreDamage(f"{name}: {len(buf)} bytes where its table says {int(self.offsets[n])} (truncated?)")
        self.meta = json.loads(bytes(buf[meta_off: meta_off + meta_len]))
        self.touched = end_table  # opening reads the header and the whole table once (checksum)

    def find(self, doc_id: str, key: int | None = None) -> tuple[int | None, int]:
        """(the index in key order of `doc_id`'s record or None, the bytes the search read)."""
        key = doc_key(doc_id) if key is None else key
        i = int(np.searchsorted(self.keys, np.uint64(key)))
        read = 8 * max(1, self.n.bit_length())
        want = doc_id.encode("utf-8")
        while i < self.n and int(self.keys[i]) == key:
            o = int(self.offsets[i])
            id_len = struct.unpack_from("<I", self.buf, o)[0]
            read += 16 + RECORD.size + id_len
            stored = bytes(self.buf[o + RECORD.size: o + RECORD.size + id_len])
            if stored == want:
                return i, read
            if doc_key(stored.decode("utf-8", "replace")) != key:  # not another id of the same key: damage
                raise StoreDamage(f"{self.name}: record {i} does not hold the document its key names")
            i += 1
        return None, read

    def record(self, i: int) -> tuple[Record, int]:
        """(record i, its checksum verified; the bytes read)."""
        o, end = int(self.offsets[i]), int(self.offsets[i + 1])
        id_len, n_tokens, la_len, ca_len, crc, _ = RECORD.unpack_from(self.buf, o)
        body = o + RECORD.size
        stop = body + _pad(id_len, 4) + 4 * n_tokens + la_len + ca_len
        if stop > end:
            raise StoreDamage(f"{self.name}: record {i} runs past its end")
        view = memoryview(self.buf)
        if zlib.crc32(view[body:stop], zlib.crc32(view[o: o + 16])) != crc:
            raise StoreDamage(f"{self.name}: record {i} checksum mismatch")
        p = body + _pad(id_len, 4)
        tokens = bytes(view[p: p + 4 * n_tokens])
        p += 4 * n_tokens
        la = bytes(view[p: p + la_len])
        ca = bytes(view[p + la_len: stop])
        return Record(bytes(view[body: body + id_len]).decode("utf-8"), tokens, la, ca), stop - o

    def records(self):
        """Every record, in key order."""
        for i in range(self.n):
            yield self.record(i)[0]
