"""The shard format (SPEC §5): the Arrow schemas from `schemas/shard-v1.json` (the writer and the reader both load
it), the `sift.*` metadata encoding, part file names and the hash that assigns a document to its bucket.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import pyarrow as pa

from ..resources import resource_path
from .names import MANIFEST, PART_GLOB, doc_key, part_name, shard_of  # noqa: F401 (the format's names)

FORMAT_VERSION = 1
SCHEMA_FILE = "shard-v1.json"
_TYPES = {"string": pa.string(), "binary": pa.binary(), "int32": pa.int32(), "float32": pa.float32(),
          "list<int32>": pa.list_(pa.int32())}


@functools.lru_cache(maxsize=None)
def schema_spec() -> dict:
    return json.loads(resource_path("schemas", SCHEMA_FILE).read_text())


def arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(c["name"], _TYPES[c["type"]], nullable=False) for c in schema_spec()["columns"]])


def manifest_schema() -> pa.Schema:
    return pa.schema([pa.field(c["name"], _TYPES[c["type"]], nullable=False)
                      for c in schema_spec()["manifest"]["columns"]])


def required_keys() -> list[str]:
    return schema_spec()["metadata"]["required"]


def matching_keys() -> list[str]:
    return schema_spec()["metadata"]["must_match_across_files"]


def token_sha256(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def encode_metadata(meta: dict) -> dict[bytes, bytes]:
    return {k.encode(): json.dumps(v, sort_keys=True).encode("utf-8") for k, v in meta.items()}


def decode_metadata(raw: dict | None) -> dict:
    out = {}
    for k, v in (raw or {}).items():
        key = k.decode("utf-8", "replace")
        if key.startswith("sift."):
            try:
                out[key] = json.loads(v.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                out[key] = ValueError(f"{key} is not UTF-8 JSON")
    return out
