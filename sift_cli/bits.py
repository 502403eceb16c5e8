"""Pack and unpack LA and CA bit vectors, bit-exact to SPEC §4. Nothing else lives here.

LA: tiles (r, c), 0 <= c <= r < P, enumerated row-major over the lower triangle; tile k is bit 7 - k % 8 of
byte k // 8 (MSB first), zero-padded to a whole byte. CA: page p is bit 7 - p % 8 of byte p // 8.
"""

from __future__ import annotations

import numpy as np


def n_pages(n_tokens: int, tile: int) -> int:
    return -(-n_tokens // tile)


def n_tiles(pages: int) -> int:
    return pages * (pages + 1) // 2


def la_nbytes(pages: int) -> int:
    return -(-n_tiles(pages) // 8)


def ca_nbytes(pages: int) -> int:
    return -(-pages // 8)


def tile_index(r: int, c: int) -> int:
    """Position of tile (r, c) in the row-major lower-triangle order."""
    return r * (r + 1) // 2 + c


def _lower_tri(pages: int) -> tuple[np.ndarray, np.ndarray]:
    return np.tril_indices(pages)  # row-major: (0,0), (1,0), (1,1), (2,0), ...


def pack_la(tiles) -> bytes:
    """tiles: bool [P, P] (only the lower triangle is read) → LA vector."""
    tiles = _as_numpy(tiles)
    rows, cols = _lower_tri(tiles.shape[0])
    return np.packbits(tiles[rows, cols].astype(np.uint8), bitorder="big").tobytes()


def unpack_la(data: bytes, pages: int) -> np.ndarray:
    """LA vector → bool [P, P] with the upper triangle False."""
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="big")[: n_tiles(pages)]
    out = np.zeros((pages, pages), dtype=bool)
    rows, cols = _lower_tri(pages)
    out[rows, cols] = bits.astype(bool)
    return out


def pack_ca(pages) -> bytes:
    """pages: bool [P] → CA vector."""
    return np.packbits(_as_numpy(pages).astype(np.uint8), bitorder="big").tobytes()


def unpack_ca(data: bytes, pages: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="big")[:pages].astype(bool)


def pack_doc(la_tiles, ca_pages) -> tuple[bytes, bytes]:
    """One document: la_tiles bool [L, H, P, P], ca_pages bool [L, H, P] → (la_bits, ca_bits).

    Vectors are concatenated layer-major, head-minor, each starting on a byte boundary.
    """
    la_tiles, ca_pages = _as_numpy(la_tiles), _as_numpy(ca_pages)
    n_layers, n_heads, pages = ca_pages.shape
    rows, cols = _lower_tri(pages)
    flat_la = la_tiles[:, :, rows, cols].reshape(n_layers * n_heads, -1).astype(np.uint8)
    la = np.packbits(flat_la, axis=1, bitorder="big")  # each row padded to whole bytes
    ca = np.packbits(ca_pages.reshape(n_layers * n_heads, pages).astype(np.uint8), axis=1, bitorder="big")
    return la.tobytes(), ca.tobytes()


def unpack_doc(la_bits: bytes, ca_bits: bytes, n_layers: int, n_heads: int, pages: int):
    """Inverse of pack_doc → (bool [L, H, P, P], bool [L, H, P])."""
    lb, cb = la_nbytes(pages), ca_nbytes(pages)
    la = np.frombuffer(la_bits, dtype=np.uint8).reshape(n_layers * n_heads, lb)
    ca = np.frombuffer(ca_bits, dtype=np.uint8).reshape(n_layers * n_heads, cb)
    la_flat = np.unpackbits(la, axis=1, bitorder="big")[:, : n_tiles(pages)].astype(bool)
    tiles = np.zeros((n_layers * n_heads, pages, pages), dtype=bool)
    rows, cols = _lower_tri(pages)
    tiles[:, rows, cols] = la_flat
    ca_flat = np.unpackbits(ca, axis=1, bitorder="big")[:, :pages].astype(bool)
    return tiles.reshape(n_layers, n_heads, pages, pages), ca_flat.reshape(n_layers, n_heads, pages)


def _as_numpy(x) -> np.ndarray:
    """A bool array of a numpy array or a torch tensor (no torch import: the shard readers run without it)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy().astype(bool)
    return np.asarray(x, dtype=bool)
