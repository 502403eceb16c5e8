"""The per-file checks of `sift validate`, column-wise over a whole part file (numpy on Arrow's buffers, no Python
per row but one sha256 per document): ids sorted, unique and in the bucket they hash to; token counts and hashes;
bit-vector lengths; LA padding bits zero and diagonal tiles set; CA padding bits zero. Each failure is a problem
(`problem`: code, file, row, doc_id, message)."""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pyarrow as pa

from ..bits import ca_nbytes, la_nbytes, n_tiles
from .columns import binary_column, gather_rows, row_chunks
from .names import doc_key

MAX_ROW_PROBLEMS = 100  # per file and code: more are summed up in one line


def problem(code: str, message: str, file: str | None = None, doc_id: str | None = None,
            row: int | None = None) -> dict:
    return {"code": code, "file": file, "doc_id": doc_id, "row": row, "message": message}


@functools.lru_cache(maxsize=None)
def _masks(pages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(LA bytes' diagonal bits, LA bytes' padding bits, CA bytes' padding bits) of a P-page vector."""
    la = np.zeros(la_nbytes(pages) * 8, dtype=np.uint8)
    la[[r * (r + 1) // 2 + r for r in range(pages)]] = 1
    pad = np.zeros(la_nbytes(pages) * 8, dtype=np.uint8)
    pad[n_tiles(pages):] = 1
    ca_pad = np.zeros(ca_nbytes(pages) * 8, dtype=np.uint8)
    ca_pad[pages:] = 1
    return np.packbits(la), np.packbits(pad), np.packbits(ca_pad)


class RowChecks:
    """The checks of one part file's table; `problems` collects what fails."""

    def __init__(self, name: str, table: pa.Table, n_layers: int, n_heads: int, tile: int, shard: int | None,
                 num_shards: int | None):
        self.name, self.problems = name, []
        self.ids = table.column("doc_id").combine_chunks()
        self._id_list = self.ids.to_pylist()
        self.n = len(self._id_list)
        self.vectors, self.tile = n_layers * n_heads, tile
        self._check_ids(shard, num_shards)
        self._check_rows(table)

    def _report(self, code: str, rows, message) -> None:
        """One problem per bad row (`message(row)`), at most MAX_ROW_PROBLEMS, then a count of the rest."""
        rows = [int(r) for r in rows]
        for r in rows[:MAX_ROW_PROBLEMS]:
            d = self._id_list[r]
            self.problems.append(problem(code, f"{self.name} row {r} ({d!r}): {message(r)}", self.name, d, r))
        if len(rows) > MAX_ROW_PROBLEMS:
            self.problems.append(problem(code, f"{self.name}: {len(rows) - MAX_ROW_PROBLEMS} more rows with the same "
                                               f"problem ({code})", self.name))

    def _check_ids(self, shard: int | None, num_shards: int | None) -> None:
        ids = self._id_list
        if any(a >= b for a, b in zip(ids, ids[1:])):
            if ids != sorted(ids):
                self.problems.append(problem("unsorted", f"{self.name}: rows are not sorted by doc_id", self.name))
            seen: dict[str, int] = {}
            dup = []
            for r, d in enumerate(ids):
                if d in seen:
                    dup.append(r)
                seen.setdefault(d, r)
            self._report("duplicate-id", dup, lambda r: f"duplicate doc_id (also row {seen[ids[r]]} of this file)")
        self.misplaced: list[str] = []
        self.keys = [doc_key(d) for d in ids]
        if shard is not None and num_shards:
            wrong = [r for r, key in enumerate(self.keys) if key % num_shards != shard]
            self.misplaced = [ids[r] for r in wrong]
            self._report("wrong-bucket", wrong, lambda r: f"belongs to bucket {doc_key(ids[r]) % num_shards}, "
                                                          f"not {shard}")

    def _check_rows(self, table: pa.Table) -> None:
        tokens = table.column("tokens").combine_chunks()
        t_off = np.asarray(tokens.offsets, dtype=np.int64)
        counts = np.diff(t_off)
        n_tokens = table.column("n_tokens").to_numpy()
        bad = np.nonzero((counts != n_tokens) | (n_tokens < 1))[0]
        self._report("token-count", bad, lambda r: f"n_tokens {n_tokens[r]} but {counts[r]} token ids")
        ok = np.ones(self.n, dtype=bool)
        ok[bad] = False
        values = tokens.values.to_numpy(zero_copy_only=False).astype("<i4", copy=False)
        hashes = table.column("token_sha256").to_pylist()
        wrong = [r for r in np.nonzero(ok)[0]
                 if hashlib.sha256(values[t_off[r]: t_off[r + 1]].tobytes()).hexdigest() != hashes[r]]
        self._report("token-hash", wrong, lambda r: "token_sha256 does not match the token ids")
        pages = np.where(ok, -(-n_tokens // self.tile), 0)
        for name, nbytes in (("la", la_nbytes), ("ca", ca_nbytes)):
            data, offs = binary_column(table.column(f"{name}_bits"))
            have = np.diff(offs)
            want = np.array([self.vectors * nbytes(int(p)) for p in pages], dtype=np.int64)
            wrong_len = np.nonzero(ok & (have != want))[0]
            self._report(f"{name}-length", wrong_len, lambda r, name=name, have=have, want=want:
                         f"{name}_bits has {have[r]} bytes, expected {want[r]} for {n_tokens[r]} tokens at "
                         f"T={self.tile}")
            good = ok & (have == want)
            self._check_bits(name, data, offs, pages, good)

    def _check_bits(self, name: str, data: np.ndarray, offs: np.ndarray, pages: np.ndarray, good: np.ndarray) -> None:
        """LA: padding zero, diagonal set; CA: padding zero. Rows grouped by page count, checked as byte masks."""
        pad_rows, diag_rows = [], []
        for p in np.unique(pages[good]):
            diag, la_pad, ca_pad = _masks(int(p))
            width = la_nbytes(int(p)) if name == "la" else ca_nbytes(int(p))
            pad = la_pad if name == "la" else ca_pad
            for rows in row_chunks(np.nonzero(good & (pages == p))[0], self.vectors * width):
                block = gather_rows(data, offs[rows], self.vectors * width).reshape(len(rows), self.vectors, width)
                if pad.any():
                    pad_rows.extend(rows[(block & pad).any(axis=(1, 2))])
                if name == "la":
                    diag_rows.extend(rows[((block & diag) != diag).any(axis=(1, 2))])
        label = name.upper()
        self._report(f"{name}-padding", sorted(pad_rows), lambda r: f"{label} padding bits are not zero")
        self._report("la-diagonal", sorted(diag_rows), lambda r: "an LA diagonal tile is not set")
