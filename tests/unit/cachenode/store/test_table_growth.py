"""The index's hash table grows without a stall (cachenode/store/table.py): a
doubling moves the old array's entries over a few at a time on the inserts
and deletes that follow, and while it does, the table answers exactly as a
dict would, mid-migration and across a run wrapping around the array's end.
No operation moves more than `STEPS` entries or makes more than `CHUNK`
slots of the next array ready, whatever the size, and each migration has
ended before the next doubling."""

from __future__ import annotations

import random
from array import array

import pytest

from cachenode.store import table as table_module
from cachenode.store.table import CHUNK, EMPTY, STEPS, Table, _slot


def _home_near_end(rng: random.Random) -> int:
    """A hash whose home is one of the last few slots of any array up to 2**20: its probe run wraps to slot 0."""
    return (rng.randrange(1 << 40) << 20) - rng.randrange(1, 6)


def _clustered(rng: random.Random) -> int:
    """A hash sharing its home with many others in any array of at least 256 slots: long runs, long shifts."""
    return (1 + rng.randrange(31)) * 8 | (rng.randrange(1 << 40) << 20)


def _wraps(old: array, hashes: array) -> bool:
    """Whether a probe run goes on past the array's end: an entry at its start lies before its home."""
    mask, i = len(old) - 1, 0
    while old[i] != EMPTY:
        if hashes[old[i]] & mask > i:
            return True
        i += 1
    return False


def _check_whole(table: Table, truth: dict[int, int]) -> None:
    """Every entry once, in one array, each slot before the cursor empty; and every hash found."""
    new, old = table._rows, table._old
    held = [r for r in new if r != EMPTY] + ([r for r in old if r != EMPTY] if old is not None else [])
    assert sorted(held) == sorted(truth.values())
    if old is not None:
        assert all(r == EMPTY for r in old[:table._cursor])
    assert all(table.find(h) == row for h, row in truth.items())


def _run(seed: int, steps: int, monkeypatch: pytest.MonkeyPatch, ops: int = 30_000) -> dict[str, int]:
    """Random inserts, deletes and finds against a dict, compared after every operation; what the run met."""
    monkeypatch.setattr(table_module, "STEPS", steps)
    rng = random.Random(seed)
    hashes = array("q")
    table = Table(hashes, size=8)
    truth: dict[int, int] = {}
    held: list[int] = []  # truth's hashes, to pick one at random
    free: list[int] = []
    met = dict.fromkeys(("growths", "growths_mid_migration", "wrapped", "found_in_old", "deleted_from_old",
                         "missed_mid_migration"), 0)
    for step in range(ops):
        kind = rng.random()
        h = (_home_near_end(rng) if kind < 0.05 else _clustered(rng) if kind < 0.2
             else rng.randrange(-(1 << 63), 1 << 63))
        if held and rng.random() < (0.55 if step * 4 // ops % 2 else 0.35):  # phases that shrink, then grow
            at = rng.randrange(len(held))
            h = held[at]
            held[at] = held[-1]
            held.pop()
            if table._old is not None and _slot(table._rows, hashes, table._mask, h) < 0:
                met["deleted_from_old"] += 1
            table.delete(h)
            free.append(truth.pop(h))
        elif h not in truth:
            row = free.pop() if free else len(hashes)
            if row == len(hashes):
                hashes.append(h)
            hashes[row] = h
            size, migrating = len(table._rows), table._old is not None
            table.insert(h, row)
            truth[h] = row
            held.append(h)
            if len(table._rows) != size:
                met["growths"] += 1
                met["growths_mid_migration"] += migrating
                met["wrapped"] += _wraps(table._old, hashes)
        assert len(table) == len(truth)
        probe = held[rng.randrange(len(held))] if held and rng.random() < 0.7 else rng.randrange(-(1 << 63), 1 << 63)
        if table._old is not None:
            in_new = _slot(table._rows, hashes, table._mask, probe) >= 0
            met["found_in_old"] += probe in truth and not in_new
            met["missed_mid_migration"] += probe not in truth
        assert table.find(probe) == truth.get(probe, EMPTY)
        assert table.find(probe) == truth.get(probe, EMPTY)  # the memo's answer
        if step % 1000 == 0:
            _check_whole(table, truth)
    _check_whole(table, truth)
    return met


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_table_answers_as_a_dict_at_every_step_of_every_migration(seed, monkeypatch):
    met = _run(seed, STEPS, monkeypatch)
    assert met["growths"] >= 8 and met["wrapped"] >= 4, met
    assert met["found_in_old"] >= 100 and met["deleted_from_old"] >= 100 and met["missed_mid_migration"] >= 100, met
    assert met["growths_mid_migration"] == 0, met


def test_a_doubling_during_a_migration_ends_the_migration_first_and_answers_stay_right(monkeypatch):
    """With one step per operation (fewer than the 3 the bound needs) doublings come mid-migration."""
    met = _run(4, 1, monkeypatch, ops=10_000)
    assert met["growths_mid_migration"] >= 1, met


def _worst_operation(steps: int, entries: int, monkeypatch: pytest.MonkeyPatch, *,
                     deletes: bool = True) -> tuple[int, int, int]:
    """Entries moved, and visits (entries moved and old slots passed), by the busiest operation while
    `entries` are inserted (and, with `deletes`, one deleted after every third); and the entries moved in all.
    Each operation also makes at most CHUNK slots of the next array ready, and each doubling of an array
    of at least CHUNK / 2 slots takes the one made ready: none is made whole at once."""
    monkeypatch.setattr(table_module, "STEPS", steps)
    rng = random.Random(entries)
    hashes = array("q", (rng.randrange(-(1 << 63), 1 << 63) for _ in range(entries)))
    table = Table(hashes, size=8)
    ops = [(table.insert, hashes[row], row) for row in range(entries)]
    if deletes:
        ops = [op for row in range(entries) for op in
               ((ops[row], (table.delete, hashes[row // 3])) if row % 3 == 2 else (ops[row],))]
    most_moved = most_visits = 0
    for fn, *args in ops:
        moved, cursor, old = table._moved, table._cursor, table._old
        spare, ready, size = table._spare, table._ready if table._spare is not None else 0, len(table._rows)
        fn(*args)
        moves = table._moved - moved
        if len(table._rows) != size:
            assert size < CHUNK // 2 or table._rows is spare and ready == 2 * size
        else:
            assert (table._ready if table._spare is not None else 0) - ready <= CHUNK
        if old is None:  # nothing to migrate before this operation (an insert that doubles only starts one)
            passed = 0
        elif table._old is old:
            passed = table._cursor - cursor
        else:  # its migration ended: every slot from the cursor to the end passed
            passed = len(old) - cursor
        most_moved, most_visits = max(most_moved, moves), max(most_visits, moves + passed)
    return most_moved, most_visits, table._moved


@pytest.mark.parametrize("entries", [1 << 10, 1 << 14, 1 << 17])
def test_no_operation_moves_more_than_steps_entries_whatever_the_size(entries, monkeypatch):
    most_moved, most_visits, moved = _worst_operation(STEPS, entries, monkeypatch)
    assert most_moved <= STEPS and most_visits <= STEPS
    assert moved >= entries // 2  # the doublings' entries did move: the count is not idle


def test_three_steps_are_the_fewest_that_end_every_migration_before_the_next_doubling(monkeypatch):
    """STEPS * S/2 >= S + S/2 (S/2 inserts from one doubling to the next, S slots to pass and S/2
    entries to move): with 3 no operation ever does more; with 2 a doubling must finish the last migration."""
    assert all(STEPS * (s // 2) >= s + s // 2 for s in (2 ** k for k in range(1, 40)))
    assert _worst_operation(3, 1 << 14, monkeypatch, deletes=False)[1] <= 3
    assert _worst_operation(2, 1 << 14, monkeypatch, deletes=False)[0] > 2


def test_the_old_array_goes_once_its_entries_have_moved():
    """After a doubling from S slots, at most (S + S/2) / STEPS inserts keep the old array alive."""
    hashes = array("q", range(1 << 12))
    table = Table(hashes, size=1 << 10)
    for row in range(1 << 9):
        table.insert(hashes[row], row)
    assert table._old is None and len(table._rows) == 1 << 10
    table.insert(hashes[1 << 9], 1 << 9)
    assert table._old is not None and len(table._rows) == 1 << 11
    inserts = 1
    while table._old is not None:
        table.insert(hashes[(1 << 9) + inserts], (1 << 9) + inserts)
        inserts += 1
    assert inserts - 1 <= -(-((1 << 10) + (1 << 9)) // STEPS)
    assert all(table.find(hashes[r]) == r for r in range((1 << 9) + inserts)) and len(table) == (1 << 9) + inserts


def test_the_next_array_is_made_ready_before_a_doubling_and_given_up_when_the_table_shrinks_back():
    """A store that hovers just under a doubling keeps its next array; one that shrank well below lets it go."""
    size = 1 << 12
    hashes = array("q", (h - (1 << 61) for h in random.Random(5).sample(range(1 << 62), size)))
    table = Table(hashes, size=size)
    doubling = size // 2  # the insert that finds this many entries doubles the table
    for row in range(doubling):
        table.insert(hashes[row], row)
    assert table._spare is not None and table._ready == 2 * size and len(table._rows) == size
    band = 4 * size // CHUNK  # inserts that make it, from where they begin
    for row in range(doubling - 1, doubling - 1 - 2 * band, -1):  # a band below where making it began
        table.delete(hashes[row])
    assert table._spare is not None
    for row in range(doubling - 1 - 2 * band, doubling // 2, -1):
        table.delete(hashes[row])
    assert table._spare is None and len(table) == doubling // 2 + 1
    for row in range(doubling // 2 + 1, doubling):
        table.insert(hashes[row], row)
    ready = table._spare
    assert ready is not None and table._ready == 2 * size
    table.insert(hashes[doubling], doubling)
    assert table._rows is ready and len(table._rows) == 2 * size
    assert all(table.find(hashes[row]) == row for row in range(doubling + 1)) and len(table) == doubling + 1
    assert all(table.find(h) == EMPTY for h in hashes[doubling + 1:])
