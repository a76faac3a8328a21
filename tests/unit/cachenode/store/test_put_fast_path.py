"""A small object's put (cachenode/store/small.py `SealedWrites.put_sealed`)
takes shortcuts where it has one case: no reservation made and given back
when reserving would evict nothing (`Index.room_for`), and a newcomer whose
key holds nothing added with its arrival at once (`Index.add_new`). Each
shortcut must leave the store exactly as the general way does: the same
files and bytes, rows, usage, evictions, policies, census, answers and
errors. So every run here is made twice, the second with both shortcuts
refused, and the two stores compared whole, over replacements, variants,
hot and extra copies, evictions, refusals, objects too large and a full disk."""

from __future__ import annotations

import errno
import hashlib
import math
import os
import random

import pytest

from cachenode.store.disk import Store
from cachenode.store.index import Index
from cachenode.store.objects import NotStored
from cachenode.store.small import record_of
from nezha.errors import NezhaError


def index_state(store: Store) -> dict:
    idx = store.index
    r = idx._rows
    out = {"rows": [bytes(r.digests), list(r.hashes), list(r.sizes), list(r.nonces), bytes(r.flags), list(r.last),
                    list(r.prev), list(r.next), list(r._free), list(r.table._rows), list(r.table._old or ()), r.count],
           "usage": dict(vars(idx.usage)), "evictions": dict(idx.evictions), "kept": sorted(idx._kept),
           "recent": list(idx._recent), "varying": {k: sorted(v) for k, v in idx._varying.items()},
           "vary": dict(idx._vary), "chunks": {k: sorted(v) for k, v in idx._chunks.items()},
           "census": [[b.hits, b.misses, b.first_bytes, dict(b.reads)] for b in idx.census._buckets]}
    for kind, p in idx.policies.items():
        h = p._history
        out[kind] = [p._now, p._since_halving, list(p._hit_gaps), list(h.last), bytes(h.counts), list(h.tags),
                     p._order.head, p._order.tail, len(p._order)]
    return out


def files_of(store: Store) -> dict[str, str]:
    files = {}
    for folder, _, names in os.walk(store.objects):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                files[name] = hashlib.sha256(f.read()).hexdigest()
    return files


_PWRITE = os.pwrite


class FullDisk:
    """`os.pwrite` failing with ENOSPC on every `every`-th call: a disk full now and then."""

    def __init__(self, every: int) -> None:
        self.every, self.calls = every, 0

    def __call__(self, fd, data, at):
        self.calls += 1
        if self.every and self.calls % self.every == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return _PWRITE(fd, data, at)


async def run(root, *, seed: int, capacity: int | None, hot_capacity: int | None, n: int, names: int,
              full_every: int = 0, monkeypatch) -> tuple[list, dict, dict]:
    """`n` puts of `names` keys (so many replace), seeded, and the store they leave: (answers, files, index)."""
    random.seed(seed)  # the files' nonces
    rng = random.Random(seed + 1)
    monkeypatch.setattr(os, "pwrite", FullDisk(full_every))
    store = Store(root, sync_interval=3600, capacity=capacity, hot_capacity=hot_capacity,
                  extra=lambda key: "/x" in key)
    await store.open(background=False)
    answers: list = []
    for i in range(n):
        k = rng.randrange(names)
        key = f"http://h{k % 3}/{'x/' if k % 5 == 0 else ''}o{k}" + ("#chunk/4096/1" if k % 11 == 0 else "")
        vary, variant = (("accept-encoding",), f"gzip{rng.randrange(2)}") if k % 4 == 0 and rng.random() < 0.7 \
            else ((), "")
        now = 1795922793.25 + i
        try:
            meta = store.put_sealed(rng.randbytes(rng.choice([0, 700, 3000])), key=key, vary=vary, variant=variant,
                                    hot=rng.random() < 0.15, url=key, host=f"h{k % 3}",
                                    headers=(("ETag", f'"{i}"'),), stored_at=now, expires_at=now + 60,
                                    stale_if_error=math.inf)
            answers.append(["stored", record_of(meta)])
        except (NotStored, NezhaError) as e:
            answers.append([type(e).__name__, str(e).replace(str(store.root), "<root>")])
        if rng.random() < 0.3:  # reads make the policy keep what is stored, and refuse newcomers
            got = store.lookup(f"http://h{(k + 1) % 3}/o{k + 1}")
            answers.append(None if got is None else record_of(got))
        answers.append([list(store.sizes()), store.index.usage.reserved])
    await store.idle()
    state = (answers, files_of(store), index_state(store))
    await store.close()
    return state


RUNS = {
    "cold, no capacity": dict(capacity=None, hot_capacity=None, n=300, names=1000),
    "replacements and variants": dict(capacity=None, hot_capacity=None, n=400, names=40),
    "hot share, evictions": dict(capacity=40_000, hot_capacity=6_000, n=400, names=200),
    "full: refusals and evictions": dict(capacity=15_000, hot_capacity=None, n=400, names=120),
    "too large for the store or the hot share": dict(capacity=2_000, hot_capacity=500, n=200, names=60),
    "a disk full now and then": dict(capacity=30_000, hot_capacity=5_000, n=300, names=100, full_every=7),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", sorted(RUNS))
async def test_a_put_s_shortcuts_leave_the_store_as_the_general_way_does(tmp_path, monkeypatch, name, seed):
    taken = {"room_for": 0, "add_new": 0}
    room_for, add_new = Index.room_for, Index.add_new

    def counted(name, fn):
        def call(*args):
            got = fn(*args)
            taken[name] += bool(got)
            return got
        return call

    monkeypatch.setattr(Index, "room_for", counted("room_for", room_for))
    monkeypatch.setattr(Index, "add_new", counted("add_new", add_new))
    fast = await run(tmp_path / "fast", seed=seed, monkeypatch=monkeypatch, **RUNS[name])
    with monkeypatch.context() as m:
        m.setattr(Index, "room_for", lambda self, size, limit: False)
        m.setattr(Index, "add_new", lambda self, meta: False)
        general = await run(tmp_path / "general", seed=seed, monkeypatch=m, **RUNS[name])
    assert taken["add_new"] > 0  # the shortcuts were taken, and the general way ran for the rest
    if RUNS[name]["capacity"] is not None:
        assert taken["room_for"] > 0
    kinds = {a[0] if isinstance(a, list) and a and isinstance(a[0], str) else "" for a in fast[0]}
    assert "stored" in kinds
    assert fast[0] == general[0]
    assert fast[1] == general[1]
    assert fast[2] == general[2]


async def test_the_runs_meet_what_they_are_named_for(tmp_path, monkeypatch):
    """The edge cases the comparison above means to cover do happen in its runs."""
    seen: dict[str, set[str]] = {}
    for name, kw in RUNS.items():
        answers, _, index = await run(tmp_path / str(len(seen)), seed=1, monkeypatch=monkeypatch, **kw)
        seen[name] = {a[0] for a in answers if isinstance(a, list) and a and isinstance(a[0], str)}
        seen[name] |= {reason for reason, n in index["evictions"].items() if n}
    assert "replaced" in seen["replacements and variants"]
    assert {"extra_copy", "capacity"} <= seen["hot share, evictions"]
    assert "Refused" in seen["full: refusals and evictions"]
    assert "TooLarge" in seen["too large for the store or the hot share"]
    assert "StoreError" in seen["a disk full now and then"]
