"""The index's compact rows (cachenode/store/rows.py): the hash table finds
every row it was given and forgets exactly what it was told to, free rows
are reused, and each kind's order is least recently used first."""

from __future__ import annotations

import hashlib
import random
from array import array

import pytest

from cachenode.store.rows import EMPTY, HOT, PACKED_ROW, USED, RowOrder, Rows, Table, digest_of, hash_of, unpack


def digest(n: int) -> bytes:
    return hashlib.sha256(f"slot/{n}".encode()).digest()


def test_the_table_agrees_with_a_dict_through_inserts_and_deletes_that_wrap_and_grow():
    """Hashes chosen to collide in the low bits, so probe runs are long, wrap around the end and shift back."""
    rng = random.Random(7)
    hashes = array("q")
    table = Table(hashes, size=8)
    truth: dict[int, int] = {}
    for step in range(20_000):
        h = rng.randrange(64) | (rng.randrange(1 << 20) << 6) if step % 3 else rng.randrange(-(1 << 63), 1 << 63)
        if h in truth and rng.random() < 0.5:
            table.delete(h)
            del truth[h]
        elif h not in truth:
            hashes.append(h)
            table.insert(h, len(hashes) - 1)
            truth[h] = len(hashes) - 1
        probe = rng.randrange(len(hashes))
        assert table.find(hashes[probe]) == truth.get(hashes[probe], EMPTY)
    assert len(table) == len(truth)
    assert all(table.find(h) == row for h, row in truth.items())


def test_a_freed_row_is_reused_and_no_longer_found():
    rows = Rows()
    a, b, c = (rows.new(digest(n), size=n, nonce=n, flags=0) for n in range(3))
    rows.free(b)
    assert rows.find(digest(1)) == EMPTY and rows.count == 2
    d = rows.new(digest(9), size=9, nonce=9, flags=0)
    assert d == b and rows.find(digest(9)) == d and rows.sizes[d] == 9
    assert [rows.find(digest(n)) for n in (0, 2)] == [a, c]
    assert sorted(rows.used()) == [a, b, c]


def test_a_slot_sharing_64_bits_of_hash_with_another_is_not_taken_for_it():
    rows = Rows()
    mine = digest(1)
    twin = mine[:8] + bytes(24)  # the same table hash, another digest
    row = rows.new(mine, size=1, nonce=1, flags=0)
    assert rows.find(twin) == EMPTY and rows.holder(twin) == row and rows.find(mine) == row


def test_each_kind_keeps_its_own_least_recently_used_order():
    rows = Rows()
    only, hot = RowOrder(rows, 0), RowOrder(rows, HOT)
    hs = []
    for n in range(5):
        row = rows.new(digest(n), size=1, nonce=n, flags=HOT if n == 2 else 0)
        hs.append(hash_of(digest(n)))
        (hot if n == 2 else only).put(hs[-1], now=n)
    only.put(hs[0], now=10)  # read again: last
    assert list(only) == [hs[1], hs[3], hs[4], hs[0]] and list(hot) == [hs[2]]
    assert hs[2] not in only and hs[2] in hot and only.get(hs[0]) == 10 and only.get(hs[2]) is None
    only.pop(hs[3])
    assert list(only) == [hs[1], hs[4], hs[0]] and len(only) == 3
    assert list(only.items()) == [(hs[1], 1), (hs[4], 4), (hs[0], 10)]


def test_rows_packed_as_runs_or_one_by_one_come_back_as_they_were_free_ones_marked():
    rows = Rows()
    made = [rows.new(digest(n), size=100 + n, nonce=n * 7, flags=HOT if n % 3 == 0 else 0) for n in range(10)]
    rows.free(made[4])
    n, packed = rows.pack(2, 5)
    assert n == 5 and len(packed) == 5 * PACKED_ROW
    got = list(unpack(n, packed))
    assert [(d, size, nonce) for d, size, nonce, _ in got] == [(digest(i), 100 + i, i * 7) for i in range(2, 7)]
    assert [bool(f & USED) for *_, f in got] == [True, True, False, True, True]
    assert [bool(f & HOT) for *_, f in got][:2] == [False, True]
    assert list(unpack(3, rows.pack_rows([9, 0, 5]))) == [
        (digest(9), 109, 63, rows.flags[9]), (digest(0), 100, 0, rows.flags[0]), (digest(5), 105, 35, rows.flags[5])]
    assert rows.pack(10, 5) == (0, b"") and rows.pack(8, 5)[0] == 2


def test_packed_rows_of_another_length_are_refused():
    rows = Rows()
    rows.new(digest(1), size=1, nonce=1, flags=0)
    n, packed = rows.pack(0, 1)
    with pytest.raises(ValueError, match="packed rows"):
        list(unpack(n + 1, packed))


def test_a_slot_digest_is_its_sha256_and_its_hash_its_first_8_bytes_whichever_slot_was_asked_before():
    slots = ["http://a/x", "http://a/x", "http://a/y", "http://a/x", "http://a/\udcff", "http://a/y"]
    for slot in slots:
        digest = digest_of(slot)
        assert digest == hashlib.sha256(slot.encode("utf-8", "surrogateescape")).digest()
        assert hash_of(digest) == hash_of(bytes(bytearray(digest))) == int.from_bytes(digest[:8], "little", signed=True)


def test_a_hash_looked_for_in_vain_is_found_once_inserted_and_not_once_deleted():
    """The table remembers its last answer, a miss too, until the next insert or delete."""
    hashes = array("q", [5, 13])
    table = Table(hashes, size=8)  # 5 and 13 share a home: 13 probes past 5
    assert table.find(13) == EMPTY and table.find(13) == EMPTY
    table.insert(5, 0)
    assert table.find(13) == EMPTY
    table.insert(13, 1)
    assert table.find(13) == 1 and table.find(13) == 1
    table.delete(5)
    assert table.find(5) == EMPTY and table.find(13) == 1
    table.delete(13)
    assert table.find(13) == EMPTY and table.find(5) == EMPTY
