"""`credentials: authorize` in a cluster: a node that does not own a key
relays the caller's request, credentials and all, to the owner, which asks
the origin before it serves; the relaying node stores nothing
(docs/private-objects.md)."""

from __future__ import annotations

import aiohttp
import pytest

from nezha.keys import key_for, parse_target
from tests.integration.cluster.conftest import HOST, settle
from tests.support_bearer import BODY, GOOD, OTHER, PATH, serve_bearer


@pytest.fixture
async def bearer(aiohttp_server):
    return await serve_bearer(aiohttp_server)


async def read(session: aiohttp.ClientSession, url: str, token: str | None) -> tuple[int, str, str, bytes]:
    headers = {"Host": HOST, **({"Authorization": f"Bearer {token}"} if token else {})}
    async with session.get(url + PATH, headers=headers) as r:
        return r.status, r.headers.get("X-Nezha-Cache", ""), r.headers.get("X-Nezha-Served-By", ""), await r.read()


async def test_a_non_owner_relays_each_read_to_the_owner_which_has_the_origin_authorise_it(bearer, start_cluster):
    upstream = str(bearer.server.make_url("")).rstrip("/")
    cluster = await start_cluster(3, upstream=upstream, credentials="authorize")
    [served] = cluster.origins
    ring = (await cluster.index.get_membership()).ring()
    [owner] = ring.owners(key_for(parse_target(PATH, HOST), served), 1)  # a node id
    other = next(n for name, n in cluster.nodes.items() if name != owner)
    async with aiohttp.ClientSession() as s:
        assert await read(s, other.url, GOOD) == (200, "peer-miss", owner, BODY)
        await settle(cluster)
        assert await read(s, other.url, GOOD) == (200, "peer-authorized", owner, BODY)
        status, cache, _, got = await read(s, other.url, OTHER)
        assert status == 403 and cache.endswith("denied") and BODY[:64] not in got
        status, cache, _, got = await read(s, other.url, None)
        assert status == 401 and BODY[:64] not in got
    assert bearer.sent == len(BODY)
    assert bearer.authorizations == [f"Bearer {GOOD}", f"Bearer {GOOD}", f"Bearer {OTHER}", None]
    holders = [name for name, n in cluster.nodes.items() if [p for p in n.data_dir.rglob("*") if p.suffix in (".meta", ".obj")]]
    assert holders == [owner]
