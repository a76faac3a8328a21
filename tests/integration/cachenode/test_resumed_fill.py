"""A cold fill led by a resume (`Range: bytes=a-b` under If-Range, as a relay sends when the owner it read from
died) asks the origin for that range first and fetches the rest of the object around it: every byte once,
no plain GET, the whole object stored (issue 38, item 4)."""

from __future__ import annotations

import hashlib

from tests.integration.cachenode.conftest import HOST
from tests.integration.cachenode.test_parallel_fill import MiB, download, node_for, parallel_origin, pattern  # noqa: F401

SIZE = 12 * MiB
AT = 5 * MiB + 4096


async def test_a_resume_costs_the_origin_its_range_and_the_head_once_and_the_object_is_stored_whole(
        parallel_origin, make_node):
    body = pattern(SIZE)
    origin = await parallel_origin(body, rate=32 * MiB)
    node = await node_for(make_node, origin)
    status, got, size, headers = await download(node.url + "/big.bin", host=HOST,
                                                headers={"Range": f"bytes={AT}-{SIZE - 1}", "If-Range": '"v1"'})
    assert status == 206 and headers["Content-Range"] == f"bytes {AT}-{SIZE - 1}/{SIZE}"
    assert got == hashlib.sha256(body[AT:]).hexdigest() and size == SIZE - AT
    await node.node.settled()
    assert origin.plain == 0, "no plain GET: the resume's own answer started the fill"
    assert origin.ranges[0] == f"bytes={AT}-{SIZE - 1}"
    assert sorted(origin.ranges[1:]) == [f"bytes=0-{AT - 1}"]
    assert origin.sent == SIZE, "every byte once"
    status, got, size, headers = await download(node.url + "/big.bin", host=HOST)
    assert (status, headers["X-Nezha-Cache"], size) == (200, "hit", SIZE)
    assert got == hashlib.sha256(body).hexdigest()


async def test_a_resume_pinned_to_an_older_version_gets_the_whole_new_one_from_one_plain_answer(
        parallel_origin, make_node):
    body = pattern(SIZE)
    origin = await parallel_origin(body)
    node = await node_for(make_node, origin)
    status, got, size, _ = await download(node.url + "/big.bin", host=HOST,
                                          headers={"Range": f"bytes={AT}-{SIZE - 1}", "If-Range": '"v0"'})
    assert (status, size, got) == (200, SIZE, hashlib.sha256(body).hexdigest())
    await node.node.settled()
    assert origin.plain == 1 and origin.sent == SIZE, "the origin's 200 was the fill: nothing asked twice"
