"""A fill checks its bytes against the digest the origin published, on every
way a fill reads them: wrong bytes are never stored and never end cleanly
at a client (issue 37, item 1)."""

import base64
import hashlib

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.integration.cachenode.conftest import HOST, key_of

PATH = "/data/shard-0001.tar"
GOOD = bytes(range(256)) * 4096  # 1 MiB
WRONG = GOOD[:500_000] + bytes([GOOD[500_000] ^ 0x01]) + GOOD[500_001:]  # the right length, one bit off


def sha256_header(body: bytes) -> dict[str, str]:
    return {"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(body).digest()).decode()}


async def read_counting(node, session, path, **headers) -> tuple[int, int, BaseException | None]:
    """(status, body bytes received, the error that cut the body or None)."""
    got = 0
    async with session.get(node.url + path, headers={"Host": HOST, **headers}) as r:
        try:
            async for chunk in r.content.iter_any():
                got += len(chunk)
        except aiohttp.ClientPayloadError as e:
            return r.status, got, e
        return r.status, got, None


# (settings, origin behaviour): each way a fill reads a body.
WAYS = {
    "spliced": ({"splice_fills": True, "fill_streams": 1}, {}),
    "through-python": ({"splice_fills": False, "fill_streams": 1}, {}),
    "chunked-origin": ({"fill_streams": 1}, {"chunked": True}),
    "parallel-ranges": ({"fill_streams": 4, "parallel_fill_threshold": 256 * 1024}, {}),
    "parallel-through-python": ({"fill_streams": 4, "parallel_fill_threshold": 256 * 1024,
                                 "splice_fills": False}, {}),
}


@pytest.mark.parametrize("way", list(WAYS))
async def test_wrong_bytes_are_cut_before_the_end_not_stored_counted_and_refetched(origin, make_node, session, way):
    settings, behaviour = WAYS[way]
    origin.put(PATH, WRONG, headers=sha256_header(GOOD), **behaviour)
    node = await make_node(**settings)
    with capture_logs() as logs:
        status, got, error = await read_counting(node, session, PATH)
        await node.node.settled()
    assert status == 200 and error is not None, (status, got, error)
    if not behaviour.get("chunked"):
        assert got < len(GOOD), "a client got the last byte of wrong bytes"
    # else every byte may have left, but never the last chunk: the body has no end.
    assert key_of(PATH) not in node.node.store
    assert list(node.node.store.tmp.iterdir()) == []
    [event] = [e for e in logs if e["event"] == "digest_mismatch"]
    assert event["origin"] == HOST and event["key"] == key_of(PATH)
    assert event["expected"] == "sha256:" + sha256_header(GOOD)["x-amz-checksum-sha256"]
    assert event["got"] == "sha256:" + sha256_header(WRONG)["x-amz-checksum-sha256"]
    assert node.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1

    origin.put(PATH, GOOD, headers=sha256_header(GOOD), **behaviour)
    status, got, error = await read_counting(node, session, PATH)
    assert (status, got, error) == (200, len(GOOD), None)
    await node.node.settled()
    assert key_of(PATH) in node.node.store
    _, headers, body = await node.get(session, PATH)
    assert body == GOOD and headers["X-Nezha-Cache"] == "hit"


@pytest.mark.parametrize("way", list(WAYS))
async def test_right_bytes_with_a_digest_are_stored_and_every_client_gets_them_whole(origin, make_node, session,
                                                                                      way):
    settings, behaviour = WAYS[way]
    origin.put(PATH, GOOD, headers=sha256_header(GOOD), **behaviour)
    node = await make_node(**settings)
    import asyncio
    results = await asyncio.gather(*(read_counting(node, session, PATH) for _ in range(3)))
    assert results == [(200, len(GOOD), None)] * 3
    await node.node.settled()
    assert key_of(PATH) in node.node.store
    assert node.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 0


async def test_a_client_joining_a_wrong_fill_late_is_cut_too(origin, make_node, session):
    """Every reader of the fill is held back from the last byte, not only its leader."""
    import asyncio
    origin.put(PATH, WRONG, headers=sha256_header(GOOD), rate=4_000_000)
    node = await make_node(fill_streams=1)
    first = asyncio.ensure_future(read_counting(node, session, PATH))
    await asyncio.sleep(0.1)
    second = await read_counting(node, session, PATH)
    for status, got, error in (await first, second):
        assert error is not None and got < len(GOOD)
    assert origin.requests[PATH] == 1


async def test_a_range_ending_at_the_last_byte_waits_for_the_check(origin, make_node, session):
    origin.put(PATH, WRONG, headers=sha256_header(GOOD), rate=4_000_000)
    node = await make_node(fill_streams=1)
    import asyncio
    whole = asyncio.ensure_future(read_counting(node, session, PATH))
    await asyncio.sleep(0.05)
    status, got, error = await read_counting(node, session, PATH, Range=f"bytes={len(GOOD) - 10}-")
    assert error is not None and got < 10
    await whole


async def test_a_composite_multipart_checksum_is_not_checked_and_the_object_is_served(origin, make_node, session):
    """A checksum of the parts' checksums: no pass over the bytes gives it, so it is set aside, said so."""
    headers = {"x-amz-checksum-crc32c": "Zm9vYg==-4", "x-amz-checksum-type": "COMPOSITE"}
    origin.put(PATH, GOOD, headers=headers)
    node = await make_node(fill_streams=1)
    with capture_logs() as logs:
        status, got, error = await read_counting(node, session, PATH)
        await node.node.settled()
    assert (status, got, error) == (200, len(GOOD), None)
    assert key_of(PATH) in node.node.store
    [said] = [e for e in logs if e["event"] == "digest_not_checked"]
    assert said["field"] == "x-amz-checksum-crc32c" and "composite" in said["reason"]
    assert node.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 0


async def test_hugging_face_linked_etag_on_the_redirect_checks_the_bytes_it_points_to(origin, make_node, session):
    """The 302 names the LFS file's sha256; the fill of its Location checks it."""
    target = "/xet-bridge/blobs/abc?revision=1"
    origin.put("/repo/resolve/main/model.safetensors", b"", status=302, headers={
        "Location": f"http://{HOST}{target}", "X-Linked-ETag": f'"{hashlib.sha256(GOOD).hexdigest()}"',
        "Cache-Control": "no-store"})
    origin.put(target, WRONG)
    node = await make_node(fill_streams=1)
    status, headers, _ = await node.get(session, "/repo/resolve/main/model.safetensors")
    assert status == 302
    status, got, error = await read_counting(node, session, target)
    assert error is not None and got < len(GOOD)
    assert node.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1

    origin.put(target, GOOD)
    await node.get(session, "/repo/resolve/main/model.safetensors")
    assert await read_counting(node, session, target) == (200, len(GOOD), None)


async def test_a_replica_copy_of_wrong_bytes_from_a_peer_is_rejected_by_the_receiver(origin, cluster, session,
                                                                                    aiohttp_server):
    """A peer's copy carries the origin's digest fields: the receiver checks its bytes against them."""
    from nezha.ring import Membership
    from tests.support_origin import TestOrigin

    nodes, members = await cluster(1)
    real = nodes["n0"]
    liar = TestOrigin()  # a peer that answers copies from its "disk" with the right fields and wrong bytes
    liar_server = await aiohttp_server(liar.app(), host="127.0.0.1")
    liar_address = f"127.0.0.1:{liar_server.port}"
    liar.put(PATH, WRONG, headers={**sha256_header(GOOD), "X-Nezha-Cache": "hit"})
    real.node.cluster.update(Membership(2, {"liar": liar_address, "n0": members.nodes["n0"]}))
    with capture_logs() as logs:
        async with session.post(real.url + "/_nezha/replicate", json={
                "host": HOST, "path": PATH, "source": "liar", "address": liar_address}) as r:
            await r.read()
        await real.node.settled()
    assert liar.requests[PATH] == 1
    assert key_of(PATH) not in real.node.store
    [event] = [e for e in logs if e["event"] == "digest_mismatch"]
    assert event["source"] == "liar" and event["field"] == "x-amz-checksum-sha256"
