"""Swap the attention function of a Hugging Face model for the length of a `with` block.

Every forward that computes attention its own way (the profiling statistics, the sparse prefill, the evaluation
probes, the benchmarks' stand-ins) goes through `swapped_attention`: the function is registered with
transformers' `AttentionInterface` under a name, the model switches to it, and the previous implementation is
restored on the way out, whatever happens inside. What the function reads besides its arguments (a plan, a
callback) it finds on a thread-local that the block sets and clears.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator


@contextlib.contextmanager
def swapped_attention(model, name: str, fn: Callable | None = None, local: threading.local | None = None,
                      **values) -> Iterator[None]:
    """Inside the block every attention layer of `model` runs `fn` (registered as `name`), or the built-in
    implementation `name` ("sdpa", "eager") when `fn` is None; `values` are set on `local` for the block and
    reset to None after it."""
    if fn is not None:
        # imported here: transformers is already loaded by whoever built the model, and importing it costs
        # seconds to every module that imports this one
        from transformers import AttentionInterface

        AttentionInterface.register(name, fn)
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        for key, value in values.items():
            setattr(local, key, value)
        try:
            yield
        finally:
            for key in values:
                setattr(local, key, None)
    finally:
        model.set_attn_implementation(previous)
