"""No callable is set on another object of the cache node while it runs.

tests/unit/cachenode/test_no_wiring_after_construction.py reads the source,
and knows a callable by its name: an attribute declared `Callable`, a lambda,
a `partial`, a function of the same module. It cannot tell that
`engine.forget_later = invalidation.forget` sets a callable (a bound method
of another room) on an attribute declared nowhere. So this test watches a
running node: every class of `cachenode/` records each callable that code of
`cachenode/` sets on one of its objects from outside that object (the setting
frame's `self` is another object), while a two-node ring built as
`nezha cache` builds it serves a cold miss, a warm hit, a relayed read, a
chunked object, an invalidation and a stop.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import aiohttp
import pytest

import cachenode
from tests.integration.cachenode.conftest import HOST, owner_and_other

MiB = 1 << 20
CHUNKED = {"chunk_threshold": 2 * MiB, "chunk_size": MiB}


def _classes() -> list[type]:
    """Every class defined in a module of `cachenode/`."""
    found = []
    for info in pkgutil.walk_packages(cachenode.__path__, "cachenode."):
        module = importlib.import_module(info.name)
        found += [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == info.name]
    return found


class Wiring:
    """Records (class, attribute, where) for each callable a frame of `cachenode/`
    sets on an object of `cachenode/` that is not its own `self`."""

    def __init__(self) -> None:
        self.found: set[tuple[str, str, str]] = set()

    def watch(self, classes: list[type], monkeypatch: pytest.MonkeyPatch) -> None:
        for cls in classes:
            monkeypatch.setattr(cls, "__setattr__", self._recording(cls.__setattr__))

    def _recording(self, original):
        found = self.found

        def __setattr__(obj, name, value):
            if callable(value) and not isinstance(value, type):
                frame = sys._getframe(1)
                while frame is not None and frame.f_code.co_name == "__setattr__":  # a wrapped base's
                    frame = frame.f_back
                if (frame is not None and frame.f_globals.get("__name__", "").startswith("cachenode.")
                        and frame.f_locals.get("self") is not obj):
                    found.add((type(obj).__qualname__, name,
                               f"{frame.f_globals['__name__']}:{frame.f_lineno} ({frame.f_code.co_name})"))
            original(obj, name, value)

        return __setattr__


@pytest.fixture
def wiring(monkeypatch) -> Wiring:
    w = Wiring()
    w.watch(_classes(), monkeypatch)
    return w


def test_the_watch_sees_a_bound_method_of_one_room_set_on_another(wiring, make_node):
    """The case the source check misses: a bound method set on an attribute that no class declares."""
    from cachenode.counts import Counts
    from cachenode.fill.flights import Flights

    flights, counts = Flights(), Counts.__new__(Counts)
    exec("flights.on_count = counts.count\nflights.added_later = 1", {"__name__": "cachenode.example"},
         {"flights": flights, "counts": counts})
    assert {(cls, name) for cls, name, _ in wiring.found} == {("Flights", "on_count")}


async def test_a_running_ring_sets_no_callable_on_another_object(wiring, cluster, origin):
    nodes, _ = await cluster(2, **CHUNKED)
    origin.put("/small.bin", b"x" * 10_000, headers={"Cache-Control": "max-age=3600"})
    origin.put("/big.bin", bytes(range(256)) * (12 * 4096), headers={"Accept-Ranges": "bytes",
                                                                     "Cache-Control": "max-age=3600"})
    async with aiohttp.ClientSession() as session:
        for path in ("/small.bin", "/big.bin"):
            owners, others = owner_and_other(nodes, path)
            for nid in [*others, *owners, *others]:  # a relayed cold miss, a hit on the owner, a relayed hit
                status, _, body = await nodes[nid].get(session, path)
                assert (status, body) == (200, origin.files[path])
        async with session.put(nodes[owners[0]].url + "/small.bin", data=b"y" * 100, headers={"Host": HOST}) as r:
            assert r.status < 500  # a write through the node: it invalidates the key on every node
        for nd in nodes.values():
            await nd.node.settled()
    for nd in nodes.values():
        await nd.server.close()  # the node stops with its listener
    assert not wiring.found, "pass these to the constructor that needs them:\n" + "\n".join(
        f"{where}: {cls}.{name}" for cls, name, where in sorted(wiring.found))
