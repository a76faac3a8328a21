"""`credentials: authorize`: a private object is stored once and every read
of it is the origin's to allow, asked with the caller's own credentials
(issue 22; docs/private-objects.md).

The origin here is a bearer-token API (tests/support_bearer.py). It
counts the object bytes it sends, so a warm read is seen to cost the origin
(almost) nothing.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.integration.cachenode.conftest import HOST, until
from tests.support_bearer import BODY, GOOD, OTHER, PATH, serve_bearer

@pytest.fixture
async def bearer(aiohttp_server):
    o = await serve_bearer(aiohttp_server)
    return o, str(o.server.make_url("")).rstrip("/")


@pytest.fixture
async def node(bearer, node_process, session, tmp_path):
    _, upstream = bearer
    config = tmp_path / "nezha.yaml"
    config.write_text(f"origins:\n  - host: {HOST}\n    upstream: {upstream}\n    credentials: authorize\n")
    n = node_process(None, args=("--config", str(config)))
    await n.ready(session)
    return n


async def read(session: aiohttp.ClientSession, node, token: str | None) -> tuple[int, str, bytes]:
    headers = {"Host": HOST, **({"Authorization": f"Bearer {token}"} if token else {})}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read()


async def test_a_reader_fills_once_and_then_reads_for_a_304_each_time(bearer, node, session):
    origin, _ = bearer
    assert await read(session, node, GOOD) == (200, "miss", BODY)
    assert origin.sent == len(BODY)
    for _ in range(3):
        assert await read(session, node, GOOD) == (200, "authorized", BODY)
    assert origin.sent == len(BODY)  # three 304s: no body byte more
    assert origin.statuses[304] == 3
    # Each read went to the origin with the reader's own token.
    assert origin.authorizations == [f"Bearer {GOOD}"] * 4


@pytest.mark.parametrize("token,status", [(OTHER, 403), ("tok-forged-0000", 401), (None, 401)])
async def test_a_caller_the_origin_refuses_gets_its_refusal_and_no_byte_of_the_stored_copy(
        bearer, node, session, token, status):
    origin, _ = bearer
    assert (await read(session, node, GOOD))[2] == BODY  # stored
    got_status, cache, got = await read(session, node, token)
    assert (got_status, cache) == (status, "denied")
    assert BODY[:64] not in got and len(got) < 100
    assert await read(session, node, GOOD) == (200, "authorized", BODY)  # the copy is still there


async def test_an_object_replaced_at_the_origin_is_read_anew_and_replaces_the_copy(bearer, node, session):
    origin, _ = bearer
    assert (await read(session, node, GOOD))[2] == BODY
    origin.body = b"version two " * 5000
    assert await read(session, node, GOOD) == (200, "miss", origin.body)
    assert await read(session, node, GOOD) == (200, "authorized", origin.body)


async def test_a_ranged_or_conditional_read_is_passed_through_whole(bearer, node, session):
    """Its Range or validators may be signed: the probe could not set its own."""
    origin, _ = bearer
    assert (await read(session, node, GOOD))[2] == BODY
    headers = {"Host": HOST, "Authorization": f"Bearer {GOOD}", "Range": "bytes=10-19"}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        assert r.status == 206 and await r.read() == BODY[10:20]
        assert r.headers["X-Nezha-Cache"] == "bypass"
    headers = {"Host": HOST, "Range": "bytes=10-19"}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        assert r.status == 401


async def test_a_dead_origin_means_no_read_from_disk_however_fresh(bearer, node, session):
    """No stale-if-error for an authorize origin: nobody is left to allow the read."""
    origin, _ = bearer
    assert (await read(session, node, GOOD))[2] == BODY
    await origin.server.close()
    status, _, got = await read(session, node, GOOD)
    assert status in (502, 504) and BODY[:64] not in got


async def test_nothing_of_a_token_is_written_to_disk_or_log(bearer, node, session):
    origin, _ = bearer
    for token in (GOOD, GOOD, OTHER, "tok-forged-0000"):
        await read(session, node, token)
    written = "".join(node.written().values())
    assert "request_completed" in written
    for token in (GOOD, OTHER, "tok-forged-0000"):
        assert token not in written


async def test_a_caller_joins_a_fill_in_progress_only_once_the_origin_allows_it(bearer, node, session):
    """The reader who missed leads the fill; another reader gets the same
    stream, after the origin said it may read that version; a stranger gets
    the origin's refusal and not a byte of the fill."""
    origin, _ = bearer
    origin.paced = True
    leader = asyncio.create_task(read(session, node, GOOD))
    await asyncio.wait_for(origin.streaming.wait(), 10)
    others = asyncio.gather(read(session, node, GOOD), read(session, node, OTHER))
    # The fill stands still after its first piece until both have been checked.
    await until(lambda: origin.statuses[304] == 1 and origin.statuses[403] == 1, timeout=10)
    origin.resume.set()
    joined, stranger = await others
    assert await leader == (200, "miss", BODY)
    assert joined == (200, "miss-joined", BODY)
    assert stranger[:2] == (403, "denied") and BODY[:64] not in stranger[2]
    assert origin.sent == len(BODY)  # one body; the joiner's and the stranger's checks carried none


async def test_a_loopback_client_posing_as_a_peer_without_the_cluster_token_is_still_checked(
        bearer, node, session):
    """Without a cluster token any loopback client passes for a peer: a peer's
    `only-if-cached` copy request must not be a way around the origin."""
    assert (await read(session, node, GOOD))[2] == BODY
    await until(lambda: list(node.data_dir.rglob("*.meta")), timeout=10)  # stored
    headers = {"Host": HOST, "X-Nezha-Peer": "node-9", "Cache-Control": "only-if-cached"}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        got = await r.read()
        assert r.status == 401 and r.headers["X-Nezha-Cache"] == "denied" and BODY[:64] not in got


async def test_a_request_saying_no_store_is_passed_and_nothing_of_it_stored(bearer, node, session):
    headers = {"Host": HOST, "Authorization": f"Bearer {GOOD}", "Cache-Control": "no-store"}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        assert r.status == 200 and r.headers["X-Nezha-Cache"] == "pass" and await r.read() == BODY
    assert not list(node.data_dir.rglob("*.meta"))
