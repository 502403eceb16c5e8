"""A GGUF checkpoint de-quantised once and cached as safetensors under the sift cache, keyed by the file's sha256,
so later loads take a second instead of twenty.

Processes that start at once (the workers of `sift profile --gpus N`, a Slurm array) share that cache: one converts
while holding a lock, the others wait and load its result; a cache directory appears whole (renamed into place) or
not at all. The file's sha256 is remembered by path, size and times, so a worker does not hash a multi-GB
checkpoint again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .atomic import fsync_directory
from .cache import cache_dir
from .faults import kill_point
from .locks import cache_lock, drop_if_free


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _quiet_gguf_converter():
    """transformers' GGUF converter draws a tqdm bar of its own (tqdm reads TQDM_DISABLE only at import)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as conv
    except ImportError:  # pragma: no cover - another transformers layout
        yield
        return
    original = conv.tqdm
    conv.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        conv.tqdm = original


def gguf_sha256(gguf: Path) -> str:
    """sha256 of a GGUF file, remembered under the sift cache by its path, size, inode and modification and change
    times (any rewrite changes the change time), so that later loads, by every worker of every later run, skip
    reading the whole file (seconds for a multi-GB checkpoint)."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
                         .encode()).hexdigest()[:32]
    memo = cache_dir() / "gguf" / "sha256" / key
    with contextlib.suppress(OSError):
        known = memo.read_text().strip()
        if len(known) == 64 and all(c in "0123456789abcdef" for c in known):
            return known
    sha = file_sha256(gguf)
    with contextlib.suppress(OSError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=memo.parent)
        with os.fdopen(fd, "w") as f:
            f.write(sha)
        os.replace(tmp, memo)
    return sha


def _cache_complete(target: Path) -> bool:
    return (target / "config.json").is_file() and (
        (target / "model.safetensors").is_file() or (target / "model.safetensors.index.json").is_file())


def _convert_gguf(gguf: Path, into: Path) -> None:
    """De-quantise a GGUF checkpoint into a safetensors checkpoint directory (model + tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet_gguf_converter():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None
    model.config.quantization_config = None
    del model.config.quantization_config
    tok.save_pretrained(into)
    model.save_pretrained(into)


def gguf_cached_dir(gguf: Path, sha: str, convert=None) -> Path:
    """The safetensors directory of a GGUF checkpoint under the cache, converting it first if no process has.

    Conversion happens once: under an exclusive lock (`gguf/.SHA.lock`, `locks.cache_lock`), after checking again that no other
    process finished it meanwhile, into a temporary directory renamed into place when complete, so processes that
    start together wait for one conversion and nobody reads a half-written one. convert(gguf, into): the
    conversion (tests pass a stand-in)."""
    root = cache_dir() / "gguf"
    target = root / sha[:24]
    if _cache_complete(target):
        drop_if_free(root / f".{sha[:24]}.lock")  # a converter killed after its rename left it
        return target
    root.mkdir(parents=True, exist_ok=True)
    with cache_lock(root, f".{sha[:24]}"):  # flock, or an O_EXCL lock file where flock is unavailable
        if _cache_complete(target):  # converted by another process while this one waited
            return target
        for old in root.glob(f".tmp-{sha[:24]}-*"):  # a killed conversion's: the lock says none is running
            shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sha[:24]}-", dir=root))
        try:
            (convert or _convert_gguf)(gguf, tmp)
            kill_point("gguf:converted")
            os.chmod(tmp, root.stat().st_mode & 0o7777)  # as readable as the cache itself (mkdtemp made it 0700)
            if target.exists() and not _cache_complete(target):  # an incomplete or damaged cache
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(tmp, target)
            except OSError:  # a process that broke a lock it took for stale won the race
                if not _cache_complete(target):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
            fsync_directory(root)
            kill_point("gguf:renamed")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target
