"""Arrow columns of a part file as numpy arrays without a Python object per row: a binary column's bytes and
offsets, and equal-width slices of many rows gathered into one array (the bits of every document of one page
count)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def binary_column(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(data bytes, offsets [n+1]) of a binary column."""
    arr = col.combine_chunks()
    if isinstance(arr, pa.ChunkedArray):  # pragma: no cover - an empty table
        arr = pa.array([], pa.binary())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    return data, offsets.astype(np.int64)


def gather_rows(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """[rows, width] bytes, row i from data[starts[i]:] (one copy of the slices, no index array)."""
    if not len(starts):
        return np.zeros((0, width), dtype=data.dtype)
    return np.concatenate([data[o: o + width] for o in starts.tolist()]).reshape(len(starts), width)


def row_chunks(rows: np.ndarray, width: int, budget: int = 1 << 22):
    """`rows` in chunks whose gathered bytes (rows × width) stay within `budget` elements."""
    step = max(1, budget // max(1, width))
    for i in range(0, len(rows), step):
        yield rows[i: i + step]
