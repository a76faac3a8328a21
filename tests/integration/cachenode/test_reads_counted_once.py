"""One read of a stored object counts as one use of it, whichever way it is served.

A hit the fast path does not take (a header off its list, or a connection it
already handed to aiohttp) goes through the handler, which looks the store up
to route it and hands the copy it found to the read loop: looked up again there,
the one read was counted as two uses (the hit ratio and the eviction policy's
history both saw two), and the ratio a scrape read depended on whether the
client's connection was reused.
"""

from __future__ import annotations

import re

import pytest

MAX_AGE = {"Cache-Control": "max-age=3600"}


async def hit_ratio(node, session) -> float:
    async with session.get(node.url + "/metrics") as r:
        text = await r.text()
    m = re.search(r"^nezha_hit_ratio_last_hour (\S+)$", text, re.M)
    assert m is not None, "nezha_hit_ratio_last_hour is not on /metrics"
    return float(m.group(1))


@pytest.mark.parametrize("size", [20_000, 300_000], ids=["small", "large"])
async def test_a_hit_the_handler_serves_counts_one_read(origin, make_node, session, size):
    body = bytes(range(256)) * (size // 256)
    origin.put("/obj", body, headers=MAX_AGE)
    node = await make_node()
    assert (await node.get(session, "/obj"))[2] == body  # the miss that stores it
    await node.node.settled()
    # A header the fast path does not know hands the request to aiohttp's handler.
    status, headers, got = await node.get(session, "/obj", headers={"X-Job": "epoch-1"})
    assert (status, got) == (200, body) and headers["X-Nezha-Cache"] == "hit"
    await node.node.settled()
    assert await hit_ratio(node, session) == 0.5, "one miss and one hit, each counted once"
