"""A read whose owners do not answer takes the bytes from the origin, never a 502, also when it joins a
flight of the key that this node leads from a peer and that peer dies (front/reads.py `_answer`,
fill/engine.py `PeerSourceFailed`).

A replica copying the key from its first owner (a replica push, cluster/handoff.py `copy_from`, or a
streaming copy) leads the key's flight here with that owner as its source. A client's read that finds the
owner unreachable (`owners_unreachable`) comes to the read loop and joins that flight; when the owner then
dies, the flight fails with the peer's error. The joiner answered that error as the origin's, 502, within a
millisecond, though the origin was never asked: what the killed-chunks stampede saw once (docs/benchmarks.md,
"Pair 4's 502"; that run's logs were not kept, so this is a cause found by reading the code, proven here, not
traced there). A peer's failure is not the origin's: the joiner looks again and leads a fill of its own from
the origin.

In-process: node b is the key's second owner; its first owner, a, is a socket that takes connections: the
first (the replica copy's request) is held until the test lets it go and then closed unanswered, every
later one (the client's relay) is closed at once.
"""

from __future__ import annotations

import asyncio
import hashlib

from nezha.keys import target_of
from nezha.ring import Membership, Peer
from structlog.testing import capture_logs
from tests.integration.cachenode.conftest import key_of, logged, until


async def test_a_read_joining_a_copy_from_a_peer_that_dies_gets_the_origins_bytes_not_a_502(
        make_node, origin, session, tmp_path):
    release, held = asyncio.Event(), asyncio.Event()
    connections = 0

    async def dying_owner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:
            held.set()
            await release.wait()
        writer.close()

    dead = await asyncio.start_server(dying_owner, "127.0.0.1", 0)
    b = await make_node(data_dir=tmp_path / "b", node_id="b", replicas=2)
    members = Membership(1, {"a": f"127.0.0.1:{dead.sockets[0].getsockname()[1]}",
                             "b": f"127.0.0.1:{b.server.port}"})
    b.node.cluster.update(members)
    path = next(p for p in (f"/owned/{i}.bin" for i in range(200))
                if list(members.ring().owners(key_of(p), 2)) == ["a", "b"])
    body = hashlib.sha256(b"peer copy").digest() * (64 * 1024 // 32)
    origin.put(path, body)

    flights = b.node.engine.flights
    lead_or_join, joined = flights.lead_or_join, asyncio.Event()

    def noting(key):
        flight, leader = lead_or_join(key)
        if not leader and key == key_of(path):
            joined.set()
        return flight, leader

    flights.lead_or_join = noting
    owner = Peer("a", members.nodes["a"])
    try:
        with capture_logs() as logs:
            copying = asyncio.ensure_future(b.node.handoff.copy_from(owner, target_of(key_of(path))))
            await asyncio.wait_for(held.wait(), 10)  # b leads the key's flight, its source the owner
            reading = asyncio.ensure_future(b.get(session, path))
            await until(logged(logs, "owners_unreachable"), timeout=30)
            await asyncio.wait_for(joined.wait(), 10)  # the read joined the copy's flight
            release.set()  # the owner dies: the copy's flight fails
            status, _, got = await asyncio.wait_for(reading, 30)
            await copying
        assert (status, hashlib.sha256(got).hexdigest()) == (200, hashlib.sha256(body).hexdigest()), \
            f"the read got {status} ({got[:200]!r})"
        assert origin.requests[path] >= 1  # the bytes came from the origin: no owner had them
    finally:
        release.set()
        dead.close()
        await dead.wait_closed()
