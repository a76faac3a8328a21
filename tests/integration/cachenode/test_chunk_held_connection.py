"""A chunk fill held to the copy behind it does not leave its origin connection in the pool with a fixed
receive buffer (chunks/landing.py `Landing._body`, fill/pace.py `Window`).

While a first owner's origin fill of a chunk waits for the owner copying it, its socket's receive buffer is
capped (SO_RCVBUF), and given back once the fill runs free. Given back is not as before: from the first
SO_RCVBUF on, the kernel no longer grows that buffer with the connection's rate, and what is given back is
clamped to net.core.rmem_max. A pooled connection would carry every later origin request on it at that buffer
per round trip, so a connection whose buffer was capped is closed at the end of its fill.

In-process nodes on 127.0.0.1 sharing one ring (R = 2), the object of test_chunks.py (64 MiB in 4 MiB chunks).
"""

from __future__ import annotations

import asyncio
from unittest import mock

from cachenode.fill.pace import Window
from tests.integration.cachenode.test_chunk_resume import a_chunk_with_an_owner_behind, copy_held_at
from tests.integration.cachenode.test_chunks import BODY, CHUNK, MiB, read, settled, sha


async def test_an_origin_connection_whose_buffer_a_held_chunk_fill_capped_is_closed_not_pooled(
        origin, cluster, session):
    """The chunk's second owner copies it from its first owner's origin fill, its copy held at 1 MiB for a
    while and then let go: the fill is held (its socket's buffer capped at least once), then runs to the
    end, and the client reading through the second owner gets the chunk's exact bytes. The origin's side
    of the connection that carried the fill then sees it closed; pooled, it stayed open (keep-alive)."""
    nodes, index, first, behind = await a_chunk_with_an_owner_behind(origin, cluster, session)
    a, b = index * CHUNK, (index + 1) * CHUNK - 1

    carried: list = []  # the origin's side of each connection a Range for the chunk came on
    answer = origin._answer

    async def noted(request):
        if request.headers.get("Range") == f"bytes={a}-{b}":
            carried.append(request.transport)
        return await answer(request)

    origin._answer = noted
    frozen, go = copy_held_at(nodes[first], MiB)
    caps: list[int] = []
    set_buffer = Window._set

    def capped(window, size):
        caps.append(size)
        set_buffer(window, size)

    with mock.patch("cachenode.fill.pace.STALL", 3600.0), mock.patch.object(Window, "_set", capped):
        reading = asyncio.ensure_future(read(nodes[behind], session, headers={"Range": f"bytes={a}-{b}"}))
        try:
            await asyncio.wait_for(frozen.wait(), 30)
            for _ in range(3000):  # until the fill, a window past P, waits with its buffer capped: 30 s at most
                if caps:
                    break
                await asyncio.sleep(0.01)
        finally:
            go.set()
        status, _, digest, n = await reading
    assert (status, n, digest) == (206, CHUNK, sha(BODY[a:b + 1]))
    assert caps, "the fill was never held with its buffer capped: the scene proves nothing"
    assert len(carried) == 1, f"the chunk was asked of the origin {len(carried)} times"
    await settled(nodes)
    for _ in range(1000):  # 10 s at most: closed by the node at once, else never (keep-alive)
        if carried[0] is None or carried[0].is_closing():
            break
        await asyncio.sleep(0.01)
    assert carried[0] is None or carried[0].is_closing(), \
        "the connection whose receive buffer the fill capped went back to the node's origin pool"
