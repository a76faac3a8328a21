"""The chunk layout of a large object: which bytes each chunk holds, which
chunks a read needs, chunk keys that no URL can name, and owners spread by
the ring."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nezha.chunks import Layout, Piece, chunk_key, chunk_of, chunk_owners, chunks_on
from nezha.keys import key_for, parse_target
from nezha.ring import Ring

MiB = 1 << 20


@pytest.mark.parametrize(("size", "chunk", "count", "last"), [
    (64 * MiB, 4 * MiB, 16, (60 * MiB, 64 * MiB - 1)),
    (64 * MiB + 1, 4 * MiB, 17, (64 * MiB, 64 * MiB)),  # one byte past a boundary: a one-byte last chunk
    (1 << 30, 32 * MiB, 32, ((1 << 30) - 32 * MiB, (1 << 30) - 1)),
    (10, 3, 4, (9, 9)),
])
def test_layout_counts_chunks_and_the_last_one_is_short(size, chunk, count, last):
    layout = Layout(size=size, chunk_size=chunk)
    assert layout.count == count
    assert layout.span(count - 1) == last
    assert layout.span(0) == (0, min(chunk, size) - 1)


def test_a_chunk_past_the_end_does_not_exist():
    with pytest.raises(IndexError):
        Layout(size=10, chunk_size=3).span(4)


@pytest.mark.parametrize(("start", "length", "pieces"), [
    (0, 10, [Piece(0, 0, 3), Piece(1, 0, 3), Piece(2, 0, 3), Piece(3, 0, 1)]),
    (4, 1, [Piece(1, 1, 1)]),                       # inside one chunk
    (2, 5, [Piece(0, 2, 1), Piece(1, 0, 3), Piece(2, 0, 1)]),  # across three
    (3, 3, [Piece(1, 0, 3)]),                       # exactly one chunk
    (9, 1, [Piece(3, 0, 1)]),                       # the last byte
    (5, 0, []),
])
def test_a_read_needs_only_the_chunks_its_bytes_lie_in(start, length, pieces):
    assert Layout(size=10, chunk_size=3).pieces(start, length) == pieces


def test_a_read_outside_the_object_is_refused():
    with pytest.raises(ValueError):
        Layout(size=10, chunk_size=3).pieces(8, 3)


@given(size=st.integers(1, 10_000), chunk=st.integers(1, 3_000), data=st.data())
def test_pieces_cover_a_range_exactly_once_in_order(size, chunk, data):
    layout = Layout(size=size, chunk_size=chunk)
    start = data.draw(st.integers(0, size - 1))
    length = data.draw(st.integers(1, size - start))
    covered = []
    for p in layout.pieces(start, length):
        first, last = layout.span(p.index)
        assert 0 < p.length and p.offset + p.length <= last - first + 1
        covered.extend(range(first + p.offset, first + p.offset + p.length))
    assert covered == list(range(start, start + length))


def test_chunk_key_round_trips_and_names_the_chunk_size():
    key = "http://images.cocodataset.org/zips/train2017.zip"
    assert chunk_of(chunk_key(key, 7, 64 * MiB)) == (key, 64 * MiB, 7)
    assert chunk_key(key, 7, 64 * MiB) != chunk_key(key, 7, 32 * MiB)
    assert chunk_of(key) is None


@pytest.mark.parametrize("raw", ["/a#chunk/4/1", "/a%23chunk/4/1", "http://h.example/a#chunk/4/1", "/a?x=#chunk/4/1"])
def test_no_url_a_client_sends_has_a_chunk_key(raw):
    """A fragment never reaches a key and an encoded # stays encoded: a client cannot name a chunk."""
    key = key_for(parse_target(raw, "h.example"), None)
    assert chunk_of(key) is None


def test_chunking_is_off_at_threshold_zero_and_on_at_the_threshold():
    assert not chunks_on(0, 1 << 40)
    assert not chunks_on(100, 99)
    assert chunks_on(100, 100)
    assert not chunks_on(100, None)


def test_chunks_of_one_object_spread_over_the_ring():
    """32 chunks of a 1 GiB object over four nodes: none owns more than 40% of them."""
    ring = Ring({f"node-{i}": 1 for i in range(4)})
    key = "http://www.cs.toronto.edu/~kriz/big.bin"
    owners = Counter(chunk_owners(ring, key, i, 32 * MiB, 1)[0] for i in range(32))
    assert len(owners) == 4
    assert max(owners.values()) <= 0.4 * 32
    assert chunk_owners(ring, key, 3, 32 * MiB, 2) == ring.owners(chunk_key(key, 3, 32 * MiB), 2)
