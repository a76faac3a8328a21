"""Targeted cache control through a node (RFC 9213): the origin's first listed
targeted field rules storing and freshness; every field is forwarded untouched."""

from __future__ import annotations

import pytest

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST

PATH = "/data/targeted.bin"


@pytest.mark.parametrize("headers,second", [
    # CDN-Cache-Control addresses a CDN-like cache: it outranks Cache-Control ...
    ({"Cache-Control": "no-store", "CDN-Cache-Control": "max-age=600"}, "hit"),
    ({"Cache-Control": "max-age=600", "CDN-Cache-Control": "no-store"}, "pass"),
    ({"Cache-Control": "max-age=600", "CDN-Cache-Control": "private"}, "pass"),
    # ... and Nezha-Cache-Control outranks both.
    ({"Cache-Control": "max-age=600", "CDN-Cache-Control": "max-age=600", "Nezha-Cache-Control": "no-store"}, "pass"),
    ({"Cache-Control": "no-store", "CDN-Cache-Control": "no-store", "Nezha-Cache-Control": "max-age=600"}, "hit"),
    # One that is no Structured Field Dictionary is ignored.
    ({"Cache-Control": "no-store", "CDN-Cache-Control": "max-age=600, &&&"}, "pass"),
])
async def test_the_first_targeted_field_rules_and_every_field_is_forwarded(origin, make_node, session, headers,
                                                                            second):
    origin.put(PATH, b"t" * 1000, headers=headers)
    node = await make_node()
    _, miss, _ = await node.get(session, PATH)
    await node.node.settled()
    _, again, body = await node.get(session, PATH)
    assert again["X-Nezha-Cache"] == second and body == b"t" * 1000
    for name, value in headers.items():
        assert miss.getall(name) == [value] and again.getall(name) == [value]


async def test_an_origin_may_list_its_own_targeted_fields(origin, make_node, session):
    origin.put(PATH, b"t" * 10, headers={"Cache-Control": "no-store", "CDN-Cache-Control": "max-age=600"})
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url, targeted_cache_control=[])])
    await node.get(session, PATH)
    await node.node.settled()
    _, again, _ = await node.get(session, PATH)
    assert again["X-Nezha-Cache"] == "pass", "with no targeted field listed, Cache-Control rules"
