"""The writers of the fault matrix as plain functions of paths (sent to a child process by name)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from sift_cli.config import ProfileConfig
from sift_cli.config_file import write_config
from sift_cli.corpus import Document
from sift_cli.faults import kill_point

CFG = ProfileConfig(tile=16)
SHARDS = 3
CKPT_ENV = "SIFT_FAULTS_CKPT"


@functools.lru_cache(maxsize=2)
def _model(ckpt: str):
    from sift_cli.models import load_model

    return load_model(ckpt, device="cpu")


if os.environ.get(CKPT_ENV):  # imported by the fork server: load the model once for every child
    import torch

    torch.set_num_threads(1)  # children of a process whose OpenMP pool has threads hang in it
    _model(os.environ[CKPT_ENV])


def profile(ckpt: str, corpus: str, out: str) -> None:
    from sift_cli.profile.job import profile_corpus

    profile_corpus(corpus, out, _model(ckpt), CFG, num_shards=SHARDS)


def add(ckpt: str, out: str, doc: tuple, prefix: list) -> None:
    from sift_cli.profile.additions import add_documents

    add_documents(out, [Document(*doc)], _model(ckpt), CFG, prefix)


def finalize(out: str) -> None:
    from sift_cli.shards.status import shard_status

    shard_status(out, finalize=True)


def index(out: str) -> None:
    from sift_cli.store.index import index_set

    index_set(out)


def calibrate(path: str, profile: dict, calibration: dict) -> None:
    write_config(path, profile, calibration)


def stand_in_conversion(gguf, into: Path) -> None:
    (into / "config.json").write_text("{}")
    kill_point("gguf:converting")
    (into / "model.safetensors").write_bytes(b"weights")


def convert(cache: str, sha: str) -> Path:
    from sift_cli.gguf_cache import gguf_cached_dir

    os.environ["SIFT_CACHE_DIR"] = cache
    return gguf_cached_dir(Path(cache) / "m.gguf", sha, convert=stand_in_conversion)


def read(out: str, expected: dict) -> None:
    """Read every document through the store until killed; a wrong bit or an error ends the child with 3."""
    from sift_cli.store.bitstore import BitStore

    ids = sorted(expected)
    while True:
        with BitStore(out) as store:
            for rec in store.get(ids):
                assert (rec.la_bits, rec.ca_bits) == expected[rec.doc_id]
