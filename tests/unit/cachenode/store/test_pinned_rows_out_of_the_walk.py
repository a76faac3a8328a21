"""Pinned objects wait out of the walk eviction makes (cachenode/store/rows.py
`RowOrder.park`, cachenode/store/index.py `protect`): an eviction or an
admission looks at a fixed number of rows however many are pinned, and picks
the victim the old walk picked, the one that asked every pinned row it met
and moved it to the back. The only change: a pinned object moves to the back
when its pin ends, not whenever a walk met it (the differential test's reference
is the old walk with that one move added)."""

from __future__ import annotations

import random

from cachenode.store.index import Index
from cachenode.store.objects import Meta
from cachenode.store.pins import Pins
from cachenode.store.room import ENDS_PER_LOOK
from cachenode.store.rows import EMPTY, RowOrder, digest_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def meta(n: int, *, size: int = 100, hot: bool = False, extra: bool = False, variant: str = "") -> Meta:
    key = f"http://h/{n}"
    return Meta(key=key, url=key, host="h", size=size, headers=(), stored_at=0.0, expires_at=60.0,
                hot=hot, extra=extra, vary=("accept",) if variant else (), variant=variant)


def pinned_index(clock: Clock, cls: type[Index] = Index) -> tuple[Index, Pins, list[tuple[str, str]]]:
    """An index and its pins wired as the store wires them."""
    gone: list[tuple[str, str]] = []
    pins = Pins(capacity=None, size_of=lambda key: 100, clock=clock)
    index = cls(evicted=lambda m, reason: gone.append((m.slot, reason)), protected=pins.holds, named=pins.held,
                ended=pins.expire)
    pins.on_hold = index.protect
    return index, pins, gone


# -- the point: what a look for a victim costs -----------------------------------------------

class Counted:
    """The index table's `find`, counted (every row an eviction looks at is found through it)."""

    def __init__(self, table) -> None:
        self.calls = 0
        self._find = table.find
        table.find = self

    def __call__(self, h: int) -> int:
        self.calls += 1
        return self._find(h)


def looks(pinned: int) -> tuple[int, int, int]:
    """Table looks of: the first eviction after the `pinned` least recently used were pinned, an
    admission past them, and an eviction for a reservation once only pinned objects are left."""
    clock = Clock()
    index, pins, gone = pinned_index(clock)
    n = 2 * pinned
    for i in range(n):
        index.add(meta(i), recent=False)
    pins.pin("Job/ml/a", [meta(i).key for i in range(pinned)])
    counted = Counted(index._rows.table)
    index.evict_to(100 * (n - 1))
    evicting, counted.calls = counted.calls, 0
    assert gone == [(meta(pinned).key, "capacity")]
    newcomer = meta(10 * n)
    assert index.admits(newcomer, index.candidate(newcomer), 100 * (n - 1)) in (True, False)
    admitting, counted.calls = counted.calls, 0
    index.evict_to(100 * pinned)  # every object not pinned goes
    assert len(index) == pinned
    index.reserve(100 * pinned)
    counted.calls = 0
    index.evict_to(100 * pinned)
    assert len(index) == pinned, "a pinned object went"
    return evicting, admitting, counted.calls


def test_an_eviction_or_an_admission_looks_at_as_many_rows_however_many_are_pinned():
    few, many = looks(10), looks(5000)
    assert few == many, f"looks with 10 pinned {few}, with 5000 {many}"
    assert max(many) <= 12


def test_pins_released_at_once_end_a_few_per_eviction_not_all_in_one():
    clock = Clock()
    index, pins, gone = pinned_index(clock)
    for i in range(3000):
        index.add(meta(i), recent=False)
    pins.pin("Job/ml/a", [meta(i).key for i in range(2000)])
    pins.release("Job/ml/a", 10)
    clock.now += 11  # all 2000 ended at once
    ended: list[int] = []
    index._ended = lambda limit: ended.append(pins.expire(limit)) or ended[-1]
    index.evict_to(100 * 2999)
    # A batch, then at most a batch more in each kind's look that found nothing else (hot, extra: none here).
    assert sum(ended) <= 4 * ENDS_PER_LOOK, f"{sum(ended)} pins ended within one eviction"
    assert gone == [(meta(2000).key, "capacity")], "the least recently used object not pinned goes first"
    # The rest end over the next evictions, and come back behind what was not pinned (those that
    # ended at the same time in the order of their keys).
    index.evict_to(100 * 1000)
    ended_first = sorted(meta(i).key for i in range(2000))[:1000]
    assert [slot for slot, _ in gone] == [meta(i).key for i in range(2000, 3000)] + ended_first


def test_when_nothing_else_may_go_a_pin_that_ended_lets_its_object_go_in_that_eviction():
    clock = Clock()
    index, pins, gone = pinned_index(clock)
    for i in range(3):
        index.add(meta(i), recent=False)
    pins.pin("Job/ml/a", [meta(i).key for i in range(3)])
    pins.release("Job/ml/a", 5)
    index.evict_to(200)
    assert gone == []
    clock.now += 6
    index._ended = lambda limit: 0 if limit > 1 else pins.expire(1)  # as if the look's first batch had ended others
    index.evict_to(200)
    assert gone == [(meta(0).key, "capacity")]


# -- which rows are out of the walk ------------------------------------------------------------

def walked(index: Index, kind: str = "only") -> list[int]:
    return list(index.policies[kind].victims())


def h(slot: str) -> int:
    return int.from_bytes(digest_of(slot)[:8], "little", signed=True)


def test_a_pin_of_a_key_holds_its_variants_and_its_hot_copy_and_the_version_that_replaces_it():
    clock = Clock()
    index, pins, gone = pinned_index(clock)
    index.add(meta(1, variant="a"))
    index.add(meta(1, variant="b"))
    index.add(meta(2, hot=True))
    index.add(meta(3))
    pins.pin("Job/ml/a", [meta(1).key, meta(2).key])
    assert walked(index) == [h(meta(3).slot)] and walked(index, "hot") == []
    assert len(index.policies["only"]) == 3 and len(index.policies["hot"]) == 1
    index.add(meta(1, variant="c"))  # a new variant of a pinned key
    index.add(meta(2, hot=True, size=200))  # a new version of a pinned object
    assert walked(index) == [h(meta(3).slot)] and walked(index, "hot") == []
    index.touch(meta(1, variant="a").slot)  # a read of a pinned object: still out of the walk
    index.drop(meta(1, variant="b").slot)  # a pinned object dropped: out of its order for good
    assert len(index.policies["only"]) == 3
    pins.release("Job/ml/a", 0)
    index.evict_to(0)
    slots = [slot for slot, _ in gone]
    assert slots[:2] == [meta(2).slot, meta(3).slot]  # the hot copy first, then the least recently used
    assert sorted(slots[2:]) == sorted([meta(1, variant="a").slot, meta(1, variant="c").slot])  # back last
    assert len(index) == 0 and all(len(p) == 0 for p in index.policies.values())


def test_a_pin_restored_before_its_object_is_loaded_holds_it_once_loaded():
    clock = Clock()
    index, pins, gone = pinned_index(clock)
    pins.restore({meta(1).key: {"Job/ml/a": None}})
    index.add(meta(1), recent=False)  # the start-up scan reaches it
    index.add(meta(2), recent=False)
    index.evict_to(0)
    assert gone == [(meta(2).key, "capacity")] and len(index) == 1


# -- the differential test: the old walk, kept here, against the order's parked rows ---------------

class WalkedOrder(RowOrder):
    """The order as it was: pinned rows stay in the walk; their pin's end moves them to the back."""

    def park(self, h: int) -> None:
        pass

    def unpark(self, h: int) -> None:
        row = self._row(h)
        if row != EMPTY and row != self.tail:  # the old `to_back`: a pass over, its last access kept
            last = self._rows.last[row]
            self._unlink(row)
            self.put(h, last)


class WalkedIndex(Index):
    """The index whose eviction walks every row and asks each whether it is pinned (the old `_candidates`)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        for kind, policy in self.policies.items():
            self._orders[kind] = policy._order = WalkedOrder(self._rows, self._orders[kind]._member)

    def _victim(self, kind: str, keep: int | None) -> int | None:
        table, order = self._rows.table, self._orders[kind]
        left = len(order)  # a protected one goes to the back: the walk meets it again at the end
        for h in order:
            if left == 0:
                return None
            left -= 1
            if h == keep:
                continue
            meta = self._meta(table.find(h))
            if self._protected(meta.key):
                order.unpark(h)  # the old `pass_over`
            else:
                return h
        return None


KINDS = ("hot", "extra", "only")


def commit(index: Index, m: Meta, limit: int, hot_limit: int) -> bool:
    admitted = index.admits(m, index.candidate(m), limit)
    index.arrived(m)
    if admitted:
        index.add(m)
        if m.hot:
            index.evict_hot_to(hot_limit, keep=m.slot)
        index.evict_to(limit, keep=m.slot)
    return admitted


def unpinned_walk(index: Index, pins: Pins, kind: str) -> list[int]:
    """The walk's rows whose key is not pinned now (asked without ending any pin)."""
    rows = index._rows
    return [h for h in index.policies[kind].victims() if index._meta(rows.table.find(h)).key not in pins._until]


def test_evictions_and_admissions_are_the_old_walks_but_for_when_a_pinned_object_moves_to_the_back():
    for seed in range(6):
        rng = random.Random(seed)
        clock = Clock()
        new, new_pins, new_gone = pinned_index(clock)
        old, old_pins, old_gone = pinned_index(clock, WalkedIndex)
        limit, hot_limit = 100 * rng.choice((12, 25, 40)), 100 * 6
        workloads = [f"Job/ml/{w}" for w in "abcd"]
        for step in range(4000):
            op = rng.random()
            n = rng.randrange(60)
            if op < 0.40:
                variant = rng.choice("ab") if n >= 50 else ""
                kind = rng.random()
                m = meta(n, size=rng.choice((100, 100, 200, 300)), hot=kind < 0.15, extra=0.15 <= kind < 0.3,
                         variant=variant)
                assert commit(new, m, limit, hot_limit) == commit(old, m, limit, hot_limit), (seed, step)
            elif op < 0.60:
                slot = meta(n, variant=rng.choice("ab") if n >= 50 else "").slot
                new.touch(slot), old.touch(slot)
            elif op < 0.66:
                slot = meta(n, variant=rng.choice("ab") if n >= 50 else "").slot
                new.drop(slot, reason="expired"), old.drop(slot, reason="expired")
            elif op < 0.76:
                w, keys = rng.choice(workloads), [meta(rng.randrange(60)).key for _ in range(rng.randrange(1, 8))]
                assert new_pins.pin(w, keys) == old_pins.pin(w, keys)
            elif op < 0.82:
                w, keep = rng.choice(workloads), rng.choice((0.0, 3.0, 20.0))
                assert new_pins.release(w, keep) == old_pins.release(w, keep)
            elif op < 0.90:
                clock.now += rng.choice((0.5, 2.0, 7.0))
            elif op < 0.95:
                size = rng.choice((100, 300, 600))
                for index in (new, old):
                    index.reserve(size)
                    index.evict_to(limit)
                    index.release(size)
            else:
                m = meta(n, size=rng.choice((100, 300)), variant=rng.choice("ab") if n >= 50 else "")
                assert new.admits(m, None, limit) == old.admits(m, None, limit), (seed, step)
            assert new_gone == old_gone, (seed, step)
            for kind in KINDS:
                assert walked(new, kind) == unpinned_walk(old, old_pins, kind), (seed, step, kind)
                assert len(new.policies[kind]) == len(old.policies[kind])
            assert new.usage == old.usage
        assert len(new_gone) > 500, "the sequence evicts"


def test_ended_pins_that_bring_nothing_back_do_not_stop_an_eviction_while_a_due_one_would():
    """The heap of pins that end also holds ends of keys dropped since: letting them go brings no row
    back, and the look goes on until one does (or none is due), so the store gets under its limit."""
    clock = Clock()
    index, pins, gone = pinned_index(clock)
    def named(key: str) -> Meta:
        return Meta(key=key, url=key, host="h", size=100, headers=(), stored_at=0.0, expires_at=60.0)

    dropped = [named(f"http://h/a{i:04d}") for i in range(300)]  # pinned, then dropped; their ends sort first
    kept = [named(f"http://h/z{i:04d}") for i in range(10)]
    for m in dropped + kept:
        index.add(m)
    pins.pin("Job/ml/a", [m.key for m in dropped + kept])
    for m in dropped:
        index.drop(m.slot, reason="expired")
    pins.release("Job/ml/a", 5.0)
    clock.now += 10  # every pin is over
    index.evict_to(500)
    assert index.usage.stored <= 500
    assert [slot for slot, _ in gone[-5:]] == [m.key for m in kept[:5]]


def test_a_pin_call_that_measures_keys_the_store_loads_meanwhile_counts_what_is_still_pinned():
    """While the store loads, measuring a restored pin's key loads it into the index (the store's
    `stored_size`), and a pin's time may pass during that call: the index's add ends no pin on the
    way (`Pins.held`), the call walks what it meant to, and the bytes count the keys still pinned."""
    clock = Clock()
    gone: list = []
    stored = {meta(i).key: meta(i) for i in range(20)}
    loaded: set[str] = set()

    def size_of(key: str) -> int | None:
        clock.now += 1.0  # each measure takes a second of this clock
        if key not in loaded and key in stored:
            loaded.add(key)
            index.add(stored[key], recent=False)  # what a lookup while loading does
        return 100 if key in stored else None

    pins = Pins(capacity=None, size_of=size_of, clock=clock)
    index = Index(evicted=lambda m, reason: gone.append(m.slot), protected=pins.holds, named=pins.held,
                  ended=pins.expire)
    pins.on_hold = index.protect
    pins.restore({key: {"Job/ml/a": clock.now + 10} for key in stored})  # released before the restart
    used = pins.used()
    assert used == 100 * len(pins._until) and used > 0
    assert sorted(pins.by_workload()) in (["Job/ml/a"], [])
    clock.now += 60
    assert pins.used() == 0 and not pins._until, "every pin ended, and its bytes with it"
    index.evict_to(0)
    assert sorted(gone) == sorted(stored), "their objects came back to the walk and could go"
