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


async def ranged(session: aiohttp.ClientSession, node, token: str | None, first: int,
                 last: int) -> tuple[int, str, bytes]:
    headers = {"Host": HOST, "Range": f"bytes={first}-{last}", **({"Authorization": f"Bearer {token}"} if token else {})}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read()


async def stored(node, event: str, size: int) -> None:
    """Until the node logged `event` for the object with `size` bytes (a commit is not instant)."""
    await until(lambda: any(e.get("event") == event and e.get("bytes") == size for e in node.events()), timeout=30)


async def test_a_ranged_read_of_a_stored_copy_is_authorised_with_its_own_range_and_served_from_disk(
        bearer, node, session):
    """The caller's Range may be signed: the probe keeps it and adds only If-None-Match."""
    origin, _ = bearer
    assert (await read(session, node, GOOD))[2] == BODY
    await stored(node, "fill_completed", len(BODY))
    assert await ranged(session, node, GOOD, 10, 19) == (206, "authorized", BODY[10:20])
    assert origin.sent == len(BODY) and origin.statuses[304] == 1
    status, cache, got = await ranged(session, node, None, 10, 19)
    assert (status, cache) == (401, "denied") and BODY[10:20] not in got


async def test_a_conditional_read_the_probe_would_change_is_passed_through_whole(bearer, node, session):
    """If-None-Match is the probe's own field: a caller that set it signed it."""
    origin, _ = bearer
    assert (await read(session, node, GOOD))[2] == BODY
    await stored(node, "fill_completed", len(BODY))
    headers = {"Host": HOST, "Authorization": f"Bearer {GOOD}", "If-None-Match": '"other"'}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        assert (r.status, r.headers["X-Nezha-Cache"], await r.read()) == (200, "bypass", BODY)


async def test_ranged_reads_from_cold_are_kept_as_parts_until_whole_then_served_from_disk(bearer, node, session):
    """A multi-part download: each signed part brings only itself; once all
    are in, the object is stored and every read of it is a 304 away."""
    origin, _ = bearer
    size = len(BODY)
    cuts = [(0, 40_000), (40_000, 80_000), (80_000, size)]
    got = await asyncio.gather(*(ranged(session, node, GOOD, a, b - 1) for a, b in cuts))
    assert got == [(206, "miss", BODY[a:b]) for a, b in cuts]
    await stored(node, "assembly_completed", size)
    assert origin.sent == size
    assert await ranged(session, node, GOOD, 40_000, 40_009) == (206, "authorized", BODY[40_000:40_010])
    assert await read(session, node, GOOD) == (200, "authorized", BODY)
    assert origin.sent == size  # two 304s since
    status, cache, _ = await ranged(session, node, OTHER, 0, 9)
    assert (status, cache) == (403, "denied")


async def test_a_part_of_an_object_replaced_at_the_origin_is_the_new_versions_and_drops_the_old_copy(
        bearer, node, session):
    origin, _ = bearer
    assert (await read(session, node, GOOD))[2] == BODY
    await stored(node, "fill_completed", len(BODY))
    origin.body = new = b"version two " * 5000
    # The probe carried the caller's own range: the origin's 206 of the new version is its answer.
    assert await ranged(session, node, GOOD, 0, 11) == (206, "miss", new[:12])
    assert origin.statuses[304] == 0
    assert await read(session, node, GOOD) == (200, "miss", new)  # the old copy is gone, not served


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
    # Committed, not only written: the .meta file is on disk a moment before
    # the store holds the object, and `only-if-cached` then finds nothing (504).
    await stored(node, "fill_completed", len(BODY))
    headers = {"Host": HOST, "X-Nezha-Peer": "node-9", "Cache-Control": "only-if-cached"}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        got = await r.read()
        assert r.status == 401 and r.headers["X-Nezha-Cache"] == "denied" and BODY[:64] not in got


async def test_a_request_saying_no_store_is_passed_and_nothing_of_it_stored(bearer, node, session):
    headers = {"Host": HOST, "Authorization": f"Bearer {GOOD}", "Cache-Control": "no-store"}
    async with session.get(f"http://127.0.0.1:{node.port}{PATH}", headers=headers) as r:
        assert r.status == 200 and r.headers["X-Nezha-Cache"] == "pass" and await r.read() == BODY
    assert not [p for p in node.data_dir.rglob("*") if p.suffix in (".meta", ".obj")]


async def test_a_copy_stored_under_authorize_stays_authorised_after_the_origin_is_switched_to_pass(
        bearer, node, node_process, session):
    """The mode is recorded with the object: a switch back to `pass` (or a
    node still on the old table mid-rollout) never hands it to anyone who asks."""
    origin, upstream = bearer
    assert (await read(session, node, GOOD))[2] == BODY
    await stored(node, "fill_completed", len(BODY))
    node.stop()
    plain = node_process(upstream)  # the same data directory, the origin now `credentials: pass`
    await plain.ready(session)
    for _ in range(2):  # the second would be the fast path's, were it not authorised
        status, cache, got = await read(session, plain, None)
        assert (status, cache) == (401, "denied") and BODY[:64] not in got
    # A reader with a token is `pass` mode's: passed through, as before the switch.
    assert await read(session, plain, GOOD) == (200, "bypass", BODY)
