"""The sift cache: GGUF weights converted once however many processes start at once, a weights hash remembered
until the file changes, and the compile caches (Triton, CuPy) under it unless the user set them."""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONVERT = r"""
import os, sys, time
from pathlib import Path
import sift_cli.gguf_cache as m

def slow_fake_conversion(gguf, into):
    with open(os.environ["CONVERSIONS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    (into / "config.json").write_text("{}")
    time.sleep(1.5)  # a reader that did not wait would see this half-written directory
    (into / "model.safetensors").write_bytes(b"w" * 1000)

path = m.gguf_cached_dir(Path(sys.argv[1]), "ab" * 32, convert=slow_fake_conversion)
print(path, (path / "model.safetensors").stat().st_size)
"""


def test_processes_starting_together_convert_the_weights_once(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    env = {**os.environ, "SIFT_CACHE_DIR": str(tmp_path / "cache"), "CONVERSIONS": str(tmp_path / "log"),
           "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT, str(gguf)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    target = tmp_path / "cache" / "gguf" / ("ab" * 12)
    assert {o.strip() for o, _ in outs} == {f"{target} 1000"}  # every process read the whole cache
    assert len((tmp_path / "log").read_text().split()) == 1  # converted by one of them
    assert not list((tmp_path / "cache" / "gguf").glob(".tmp-*"))


def test_conversion_replaces_what_a_killed_one_left(tmp_path, monkeypatch):
    from sift_cli import gguf_cache

    monkeypatch.setenv("SIFT_CACHE_DIR", str(tmp_path))
    sha = "cd" * 32
    root = tmp_path / "gguf"
    (root / f".tmp-{sha[:24]}-dead").mkdir(parents=True)  # a conversion killed half-way
    (root / sha[:24]).mkdir()
    (root / sha[:24] / "config.json").write_text("{}")  # an incomplete cache (no weights)
    calls = []

    def convert(gguf, into):
        calls.append(into)
        (into / "config.json").write_text("{}")
        (into / "model.safetensors").write_bytes(b"w")

    path = gguf_cache.gguf_cached_dir(tmp_path / "x.gguf", sha, convert=convert)
    assert path == root / sha[:24] and (path / "model.safetensors").is_file() and len(calls) == 1
    assert sorted(p.name for p in root.iterdir()) == [sha[:24]]  # the lock file goes with its release
    assert oct(path.stat().st_mode & 0o777) == oct(root.stat().st_mode & 0o777)
    assert gguf_cache.gguf_cached_dir(tmp_path / "x.gguf", sha, convert=convert) == path and len(calls) == 1


def test_weights_hash_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    from sift_cli import gguf_cache

    monkeypatch.setenv("SIFT_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"one")
    hashed = []
    real = gguf_cache.file_sha256
    monkeypatch.setattr(gguf_cache, "file_sha256", lambda p: hashed.append(p) or real(p))
    first = gguf_cache.gguf_sha256(gguf)
    assert gguf_cache.gguf_sha256(gguf) == first and len(hashed) == 1
    time.sleep(0.01)
    gguf.write_bytes(b"two")  # same size, new contents
    assert gguf_cache.gguf_sha256(gguf) == real(gguf) != first and len(hashed) == 2


def test_compile_caches_go_under_the_sift_cache_unless_set(tmp_path, monkeypatch):
    from sift_cli.cache import compile_cache_env, use_shared_compile_caches

    assert compile_cache_env({"SIFT_CACHE_DIR": str(tmp_path), "TRITON_CACHE_DIR": "/t"}) == \
        {"CUPY_CACHE_DIR": str(tmp_path / "cupy")}
    monkeypatch.setenv("SIFT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("CUPY_CACHE_DIR", "/mine")
    assert use_shared_compile_caches() == {"TRITON_CACHE_DIR": str(tmp_path / "triton")}
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton") and os.environ["CUPY_CACHE_DIR"] == "/mine"
