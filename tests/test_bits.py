import numpy as np
import pytest

from sift_cli import bits


def test_golden_la_vector():
    tiles = np.zeros((3, 3), dtype=bool)
    for r, c in [(0, 0), (1, 1), (2, 0), (2, 2)]:
        tiles[r, c] = True
    assert bits.pack_la(tiles) == bytes([0xB4])


def test_golden_ca_vector():
    assert bits.pack_ca(np.array([True, False, True])) == bytes([0xA0])


@pytest.mark.parametrize("pages", [1, 2, 3, 4, 7, 8, 9, 16, 33])
def test_lengths(pages):
    assert bits.la_nbytes(pages) == -(-(pages * (pages + 1) // 2) // 8)
    assert bits.ca_nbytes(pages) == -(-pages // 8)
    tiles = np.tril(np.ones((pages, pages), dtype=bool))
    assert len(bits.pack_la(tiles)) == bits.la_nbytes(pages)
    assert len(bits.pack_ca(np.ones(pages, dtype=bool))) == bits.ca_nbytes(pages)


def test_tile_order_is_row_major_lower_triangle():
    order = [(r, c) for r in range(5) for c in range(r + 1)]
    assert [bits.tile_index(r, c) for r, c in order] == list(range(len(order)))
    for k, (r, c) in enumerate(order):
        tiles = np.zeros((5, 5), dtype=bool)
        tiles[r, c] = True
        data = bits.pack_la(tiles)
        assert data[k // 8] == 1 << (7 - k % 8)
        assert sum(data) == data[k // 8]


@pytest.mark.parametrize("pages", [1, 3, 5, 8, 13])
def test_doc_round_trip(pages):
    rng = np.random.default_rng(pages)
    la = np.tril(rng.random((4, 3, pages, pages)) < 0.4)
    ca = rng.random((4, 3, pages)) < 0.5
    la_b, ca_b = bits.pack_doc(la, ca)
    assert len(la_b) == 12 * bits.la_nbytes(pages) and len(ca_b) == 12 * bits.ca_nbytes(pages)
    la2, ca2 = bits.unpack_doc(la_b, ca_b, 4, 3, pages)
    assert (la2 == la).all() and (ca2 == ca).all()
    # each vector starts on a byte boundary and equals the single-vector packer
    lb = bits.la_nbytes(pages)
    assert la_b[5 * lb: 6 * lb] == bits.pack_la(la[1, 2])
    assert (bits.unpack_la(la_b[:lb], pages) == la[0, 0]).all()
