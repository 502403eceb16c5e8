"""The sift cache directory (`$SIFT_CACHE_DIR`, else `$XDG_CACHE_HOME/sift` or `~/.cache/sift`) and the compile
caches kept under it.

Everything here is plain standard library, so that a launcher (`sift profile --gpus N`) can prepare its workers
without importing torch. What lives in the cache:

- `gguf/`: GGUF checkpoints de-quantised once to safetensors (`models.py`), shared by every process that loads them;
- `triton/`, `cupy/`: Triton's and CuPy's compiled kernels (`TRITON_CACHE_DIR`, `CUPY_CACHE_DIR`, set for a worker
  unless the user set them), so the workers of one run and later runs compile each kernel once; with
  `SIFT_CACHE_DIR` on a shared file system, once for every node;
- `sample-corpus/`, `eval/`: the built-in sample corpus and cached evaluation inputs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

# compile caches a worker shares through the sift cache: environment variable → folder under cache_dir()
COMPILE_CACHES = {"TRITON_CACHE_DIR": "triton", "CUPY_CACHE_DIR": "cupy"}


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    root = env.get("SIFT_CACHE_DIR") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sift")
    return Path(root)


def compile_cache_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The compile-cache variables to add to `env` (default: this process's): each of `COMPILE_CACHES` the
    environment does not set already, pointing under the sift cache. A value the user set is never replaced."""
    env = os.environ if env is None else env
    root = cache_dir(env)
    return {var: str(root / sub) for var, sub in COMPILE_CACHES.items() if not env.get(var)}


def use_shared_compile_caches() -> dict[str, str]:
    """Point this process's Triton and CuPy compile caches under the sift cache (unless set); returns what was set.
    Both read their variable when they compile, so this works as long as nothing was compiled yet."""
    added = compile_cache_env()
    os.environ.update(added)
    return added
