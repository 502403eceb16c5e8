"""A layer's heads spread over a pool of Python threads, each running PyTorch with one intra-op thread.

The gather backend issues hundreds of small attention calls per layer. Each is a parallel region of PyTorch's
intra-op threads, and every region ends in a barrier: on a busy machine one descheduled thread stalls the others,
so at 2 threads the layers of a 3.7K-token prompt took several times as long as at 1 thread (2 shared cores,
docs/benchmarks.md). Heads are independent (their outputs are disjoint), so they go to the workers whole, one
PyTorch thread each, and the calls release the GIL: the cores stay busy without a barrier per call.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _workers(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(n, thread_name_prefix="sift-heads"), n
        return _pool


def map_heads(fn, n_heads: int) -> None:
    """fn(h) for every head h, on as many workers as PyTorch has intra-op threads, each op single-threaded
    meanwhile; inline when there is one thread or one head. fn writes its own head's outputs."""
    threads = torch.get_num_threads()
    if threads <= 1 or n_heads <= 1:
        for h in range(n_heads):
            fn(h)
        return
    pool = _workers(min(threads, n_heads))
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def in_callers_mode(h):  # inference and grad modes are per thread: the workers take the caller's
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            fn(h)

    torch.set_num_threads(1)  # process-wide: restored below
    try:
        for f in [pool.submit(in_callers_mode, h) for h in range(n_heads)]:
            f.result()
    finally:
        torch.set_num_threads(threads)
