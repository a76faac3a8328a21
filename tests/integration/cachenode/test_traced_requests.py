"""Four requests traced call by call: each enters front/handler.py once on each
node it reaches, and a warm plain hit not at all.

The import checker sees imports; a request's path at run time can still
re-enter the handler (a join-or-lead loop calling `handle` again) or call
back up through a callable set after construction. So the event loop's
thread is profiled (`sys.setprofile`) while one request is answered, and the
fresh calls of `Handler.handle` are counted: a cold miss, a warm hit (the
fast path below aiohttp, which is also all a follower worker serves:
cachenode/workers/follower.py builds no node and no handler), a signed hit
(`credentials: authorize`, the origin allows the read) and a chunked
object's read through a node that does not own the object.

Calls from a lower room of the node to a higher one (the layers of
`pyproject.toml`) are collected too: each is a protocol handed down at
construction (docs/architecture.md, "The cache node's rooms"), and the test
names them, so a new one is a decision someone writes down.
"""

from __future__ import annotations

import sys
from collections import Counter

import aiohttp

from cachenode.front.handler import Handler
from cachenode.chunks.peers import owners_of
from nezha.chunks import Layout
from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST, key_of, owner_and_other
from tests.support_bearer import BODY as PRIVATE, GOOD, PATH as PRIVATE_PATH, serve_bearer

MiB = 1 << 20

# The node's rooms from the top down (pyproject.toml, the layers contract).
LAYERS = ["cachenode.cli", "cachenode.workers", "cachenode.app", "cachenode.node", "cachenode.tls",
          "cachenode.front", "cachenode.cluster", "cachenode.chunks", "cachenode.fill", "cachenode.peers",
          "cachenode.store", "cachenode.counts", "cachenode.metrics", "cachenode.http", "cachenode.kernel", "cachenode.tasks",
          "cachenode.cluster_view"]


def layer(module: str) -> int | None:
    for i, room in enumerate(LAYERS):
        if module == room or module.startswith(room + "."):
            return min(i, LAYERS.index("cachenode.metrics"))  # the last five are one layer
    return None


class Trace:
    """Fresh calls of `Handler.handle`, and calls from one room of the node up into a higher one."""

    def __init__(self) -> None:
        self.entries: list = []  # the frames of `handle`'s calls, kept so none is counted twice
        self.up: Counter[tuple[str, str]] = Counter()

    def __enter__(self) -> "Trace":
        handle = Handler.handle.__code__

        def profile(frame, event, arg) -> None:
            if event != "call":
                return
            if frame.f_code is handle and not any(f is frame for f in self.entries):
                self.entries.append(frame)  # a coroutine's resumption is a "call" too: the same frame
            callee = frame.f_globals.get("__name__", "")
            low = layer(callee)
            caller = frame.f_back
            if low is None or caller is None:
                return
            high = layer(caller.f_globals.get("__name__", ""))
            if high is not None and low < high:
                self.up[(f"{caller.f_globals['__name__']}.{caller.f_code.co_qualname}",
                         f"{callee}.{frame.f_code.co_qualname}")] += 1

        sys.setprofile(profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)

    @property
    def handled(self) -> int:
        return len(self.entries)

    def up_calls(self) -> set[tuple[str, str]]:
        """(room, room) of each call up: `cachenode.fill`, `cachenode.node`, ..."""
        return {(room(caller), room(callee)) for caller, callee in self.up}


def room(name: str) -> str:
    return ".".join(name.split(".")[:2])


async def get(session, node, path, headers=None) -> tuple[int, str, bytes]:
    async with session.get(node.url + path, headers={"Host": HOST, **(headers or {})}) as r:
        return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read()


async def test_a_cold_miss_and_a_warm_hit_enter_the_handler_once_and_the_fast_paths_hit_never(
        make_node, origin, session):
    origin.put("/a.bin", b"a" * 200_000, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    with Trace() as cold:
        assert await get(session, node, "/a.bin") == (200, "miss", b"a" * 200_000)
        await node.node.settled()
    with Trace() as back:  # on the connection aiohttp answered the miss on, back on the fast path
        assert await get(session, node, "/a.bin") == (200, "hit", b"a" * 200_000)
    with Trace() as handled:  # a field off the fast path's allow-list: aiohttp and the handler answer it
        assert await get(session, node, "/a.bin", {"X-Client": "1"}) == (200, "hit", b"a" * 200_000)
    async with aiohttp.ClientSession() as fresh:
        with Trace() as fast:  # a new connection: the fast path's, as on a follower worker
            assert await get(fresh, node, "/a.bin") == (200, "hit", b"a" * 200_000)
    assert (cold.handled, back.handled, handled.handled, fast.handled) == (1, 0, 1, 0)
    for trace in (cold, back, handled, fast):
        assert trace.up_calls() <= PROTOCOLS, sorted(trace.up_calls() - PROTOCOLS)


async def test_a_small_cold_miss_on_a_fresh_connection_is_led_below_the_handler_and_never_enters_it(
        make_node, origin):
    """A plain cold miss whose answer is stored at once is the fast path's own
    (front/fast_misses.py): one request, no pass through the handler."""
    origin.put("/s.bin", b"s" * 16_384, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    async with aiohttp.ClientSession() as fresh:
        with Trace() as cold:
            assert await get(fresh, node, "/s.bin") == (200, "miss", b"s" * 16_384)
            await node.node.settled()
    assert cold.handled == 0
    assert cold.up_calls() <= PROTOCOLS, sorted(cold.up_calls() - PROTOCOLS)


async def test_a_signed_hit_enters_the_handler_once(make_node, aiohttp_server, session):
    bearer = await serve_bearer(aiohttp_server)
    upstream = str(bearer.server.make_url("")).rstrip("/")
    node = await make_node(origins=[Origin(host=HOST, upstream=upstream, credentials="authorize")])
    auth = {"Authorization": f"Bearer {GOOD}"}
    assert await get(session, node, PRIVATE_PATH, auth) == (200, "miss", PRIVATE)
    await node.node.settled()
    with Trace() as signed:
        assert await get(session, node, PRIVATE_PATH, auth) == (200, "authorized", PRIVATE)
    assert signed.handled == 1
    assert signed.up_calls() <= PROTOCOLS, sorted(signed.up_calls() - PROTOCOLS)


def chunk_owner(nodes, path, index, size=8 * MiB) -> str:
    """The first owner of chunk `index` as the nodes place it (nezha/chunks.py `place`: the ring, loads bounded)."""
    anyone = next(iter(nodes.values())).node
    return owners_of(anyone.cluster, key_of(path), Layout(size=size, chunk_size=MiB))[index][0].id


async def test_a_chunked_read_enters_each_nodes_handler_once(cluster, origin, session):
    nodes, _ = await cluster(3, chunk_threshold=2 * MiB, chunk_size=MiB)
    body = bytes(range(256)) * (8 * 4096)  # 8 MiB: 8 chunks over three nodes
    origin.put("/big.bin", body, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"})
    owners, others = owner_and_other(nodes, "/big.bin")
    reader = nodes[others[0]]
    with Trace() as chunked:
        status, _, got = await get(session, reader, "/big.bin")
        for nd in nodes.values():
            await nd.node.settled()
    assert (status, got) == (200, body)
    # The reader's request, the manifest asked of the object's owner, and each chunk asked
    # of its owner: one entry each, none re-entered. Chunk 0 came in the owner's first answer
    # (cachenode/fill/chunking.py): when another node owns it, that node is asked to copy it
    # and asks the object's owner for it, one entry each.
    adopted = 2 if chunk_owner(nodes, "/big.bin", 0) != owners[0] else 0
    asked = 1 + 1 + sum(1 for i in range(8) if chunk_owner(nodes, "/big.bin", i) != reader.node.node_id) + adopted
    assert chunked.handled == asked
    assert chunked.up_calls() <= PROTOCOLS, sorted(chunked.up_calls() - PROTOCOLS)


# The calls up the rooms a request makes, each through what the room below was handed at
# construction (cachenode/node.py, cachenode/app.py), and typed there as a protocol or a callable.
PROTOCOLS = {
    ("cachenode.fill", "cachenode.cluster"),  # `replicate`: copies to the other owners once a fill is stored
    ("cachenode.fill", "cachenode.chunks"),  # `chunks`: a large object's chunks spread over the ring
}
# Not on these requests' path, so not traced here: the store's `on_evict` (an eviction, at capacity) calls up
# into the node, through a closure of cachenode/app.py (docs/architecture.md, "The cache node's rooms").
