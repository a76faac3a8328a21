"""A stampede survives its leader (issue 38, item 4): real node processes, a real redis-server, an origin that
answers ranges slowly.

Five clients read one cold object through the three nodes of a cluster (two owners per key); the node filling
it is killed (SIGKILL) a third of the way in. Every client gets exact bytes, and the origin gets the first
fill and one request per range nobody has (however many clients wait on it): the tail, and the head the dead
leader took with it unless the second owner's copy kept it (its clients shared one stream from the leader).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal

import aiohttp

from tests.integration.cachenode.conftest import RangedOrigin
from tests.integration.cluster.conftest import HOST

MiB = 1 << 20
SIZE = 12 * MiB
KILL_AT = 4 * MiB


async def test_five_clients_on_three_nodes_cost_one_resume_per_missing_range_when_the_leader_dies(
        start_cluster, redis_server, aiohttp_server):
    body = os.urandom(SIZE)
    upstream = RangedOrigin(body, {"ETag": '"v1"', "Cache-Control": "max-age=3600"}, rate=6 * MiB)
    server = await aiohttp_server(upstream.app(), host="127.0.0.1")
    cluster = await start_cluster(3, replicas=2, redis_url=redis_server.url,
                                  upstream=f"http://127.0.0.1:{server.port}")
    ring = (await cluster.index.get_membership()).ring()
    path = next(p for p in (f"/big/{i}.bin" for i in range(200))
                if ring.owners(f"http://{HOST}{p}", 2) == ["node-0", "node-1"])
    leader, second, other = (cluster.nodes[n] for n in ("node-0", "node-1", "node-2"))
    # The leader's own client starts the fill; the four others join it through the second owner and the
    # non-owner (two each), so every one of them is relayed from the leader when it dies.
    through = [leader, second, second, other, other]
    got = [hashlib.sha256() for _ in through]
    sizes = [0] * len(through)
    joined = asyncio.Event()

    async def read(i: int, s: aiohttp.ClientSession) -> int:
        if i:
            await joined.wait()
        async with s.get(through[i].url + path, headers={"Host": HOST}) as r:
            assert r.status == 200, await r.text()
            async for chunk in r.content.iter_chunked(64 * 1024):
                got[i].update(chunk)
                sizes[i] += len(chunk)
                if i == 0 and not joined.is_set():
                    joined.set()
                if i == 0 and sizes[0] >= KILL_AT and leader.proc.poll() is None:
                    leader.proc.send_signal(signal.SIGKILL)
                    return sizes[0]  # this client's node is gone: its read ends with it
        return sizes[i]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        results = await asyncio.gather(*(read(i, s) for i in range(len(through))), return_exceptions=True)
    assert leader.proc.wait(5) == -signal.SIGKILL
    want = hashlib.sha256(body).hexdigest()
    assert [h.hexdigest() for h in got[1:]] == [want] * 4, results
    ranges = [h["Range"] for h in upstream.seen if "Range" in h]
    # The first fill (a plain GET), then one request per byte range the survivors lacked, however many
    # clients waited on it: the resume of the missing tail, and the head the dead leader took with it.
    assert sum(1 for h in upstream.seen if "Range" not in h) == 1, [h.get("Range") for h in upstream.seen]
    # The second owner's two clients share one stream from the leader when they come at once, kept as its
    # replica as it arrives (cluster/streaming_copies.py): the head is then the second owner's already and
    # its copy goes on from the origin for the tail alone. Else it has only the resume of the tail, and
    # refills the head.
    spans = sorted(tuple(int(x) for x in r.removeprefix("bytes=").split("-")) for r in ranges)
    if len(spans) == 1:
        assert 0 < spans[0][0] and spans[0][1] == SIZE - 1, f"the copy's rest, from the byte it had: {ranges}"
    else:
        assert len(ranges) == 2, f"one resume and one refill of the head: {ranges}"
        assert spans[0][0] == 0 and spans[0][1] + 1 == spans[1][0] and spans[1][1] == SIZE - 1, \
            f"the refill fetched again what the resume brought: {ranges}"
    assert all(h.get("If-Range") == '"v1"' for h in upstream.seen if "Range" in h)
