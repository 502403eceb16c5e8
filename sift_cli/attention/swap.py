"""Swap the attention function of a Hugging Face model for the length of a `with` block.

Every forward that computes attention its own way (the profiling statistics, the sparse prefill, the evaluation
probes, the benchmarks' stand-ins) goes through `swapped_attention`: the function is registered with
transformers' `AttentionInterface` under a name, the model switches to it, and the previous implementation is
restored on the way out, whatever happens inside.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def swapped_attention(model, name: str, fn: Callable | None = None) -> Iterator[None]:
    """Inside the block every attention layer of `model` runs `fn` (registered as `name`), or the built-in
    implementation `name` ("sdpa", "eager") when `fn` is None."""
    if fn is not None:
        # imported here: transformers is already loaded by whoever built the model, and importing it costs
        # seconds to every module that imports this one
        from transformers import AttentionInterface

        AttentionInterface.register(name, fn)
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
