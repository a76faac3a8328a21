"""A relayed request names the same object as the client's (found by docs/recipes/hugging-face.md).

The Hub's CDN URLs carry `response-content-disposition=inline%3B+filename*%3DUTF-8%27%27model.safetensors`,
and boto3 sends an S3 key such as `shard'1'(a).tar` as `shard%271%27%28a%29.tar`. A node that relays such
a request to the key's owner must send the target as the client wrote it: the owner makes the cache key
from what it receives, and `%27` re-spelt as `'` (yarl's default when the relay's URL string is parsed)
is another key, so an object read once through a relay and once directly is stored twice and fetched
from the origin twice.
"""

from __future__ import annotations

import os

import pytest
from yarl import URL

from tests.integration.cachenode.conftest import HOST, owner_and_other


async def get(session, node, target: str):
    async with session.get(URL(node.url + target, encoded=True), headers={"Host": HOST},
                           allow_redirects=False) as r:
        return r.status, r.headers.get("X-Nezha-Cache"), await r.read()


@pytest.mark.parametrize("target", [
    "/d/q.bin?response-content-disposition=inline%3B+filename*%3DUTF-8%27%27q.bin",
    "/datasets/train/shard%271%27%28a%29.tar",
], ids=["hub-cdn-query", "s3-key-path"])
async def test_an_object_read_through_a_relay_is_a_hit_when_read_from_its_owner_directly(
        origin, cluster, session, target):
    body = os.urandom(200_000)
    # Served under each spelling the origin may be asked for: the test is about the cache's key, not the origin.
    respelt = target.replace("%27", "'").replace("%28", "(").replace("%29", ")")
    for spelling in (target, respelt):
        origin.put(spelling, body)
    nodes, _ = await cluster(2)
    owners, others = owner_and_other(nodes, target)
    assert await get(session, nodes[others[0]], target) == (200, "peer-miss", body)
    await nodes[owners[0]].node.settled()
    assert await get(session, nodes[owners[0]], target) == (200, "hit", body)
    assert sum(origin.requests[s] for s in {target, respelt}) == 1, dict(origin.requests)
