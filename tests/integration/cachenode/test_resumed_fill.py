"""A cold fill led by a resume (`Range: bytes=a-b` under If-Range, as a relay sends when the owner it read from
died) asks the origin for that range first and fetches the rest of the object around it: every byte once,
no plain GET, the whole object stored (issue 38, item 4), and checked whole against the digest its
206 (Repr-Digest) or the relay resuming (X-Nezha-Digest) names (issue 37)."""

from __future__ import annotations

import base64
import hashlib

import aiohttp
import pytest
from structlog.testing import capture_logs

from cachenode.http.digests import Algorithm, Expected, carry
from nezha.wire import DIGEST_HEADER, PEER_HEADER
from tests.integration.cachenode.conftest import HOST, key_of
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


def repr_digest(body: bytes) -> str:
    return f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode()}:"


async def read_until_cut(url: str, headers: dict[str, str]) -> tuple[int, int, bool]:
    """(status, bytes received, whether the body was cut before its end)."""
    got = 0
    async with aiohttp.ClientSession() as s:
        async with s.get(url, headers={"Host": HOST, **headers}) as r:
            try:
                async for chunk in r.content.iter_any():
                    got += len(chunk)
            except aiohttp.ClientPayloadError:
                return r.status, got, True
            return r.status, got, False


RESUME = {"Range": f"bytes={AT}-{SIZE - 1}", "If-Range": '"v1"'}


@pytest.mark.parametrize("right", [True, False], ids=["right-bytes", "wrong-bytes"])
async def test_a_fill_led_by_a_relays_resume_is_checked_whole_against_the_digest_the_relay_handed_on(
        parallel_origin, make_node, right):
    """The relay names the digest of the head it began with; the fill its
    206 leads hashes the head it fetches around it and the 206 in order:
    right bytes are stored, wrong ones are not, and the relay is cut before
    the last byte."""
    body = pattern(SIZE)
    origin = await parallel_origin(body)
    node = await node_for(make_node, origin)
    named = body if right else body[:100] + bytes([body[100] ^ 1]) + body[101:]
    handed = carry(Expected(Algorithm.SHA256, hashlib.sha256(named).digest(), "x-amz-checksum-sha256"))
    with capture_logs() as logs:
        status, got, cut = await read_until_cut(node.url + "/big.bin",
                                                {**RESUME, PEER_HEADER: "n9", DIGEST_HEADER: handed})
        await node.node.settled()
    assert status == 206
    if right:
        assert (got, cut) == (SIZE - AT, False)
        [done] = [e for e in logs if e["event"] == "fill_completed"]
        assert done["verified"] == "x-amz-checksum-sha256 via X-Nezha-Digest"
        assert key_of("/big.bin") in node.node.store
    else:
        assert cut and got < SIZE - AT
        [event] = [e for e in logs if e["event"] == "digest_mismatch"]
        assert event["field"] == "x-amz-checksum-sha256 via X-Nezha-Digest"
        assert key_of("/big.bin") not in node.node.store
        assert node.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1
    assert origin.plain == 0 and origin.sent == SIZE, "the check costs the origin nothing more"


async def test_a_digest_handed_on_by_a_client_is_not_believed(parallel_origin, make_node):
    """Only a peer hands on a digest: a client's would let it make the node refuse right bytes."""
    body = pattern(SIZE)
    origin = await parallel_origin(body)
    node = await node_for(make_node, origin)
    wrong = carry(Expected(Algorithm.SHA256, hashlib.sha256(b"other bytes").digest(), "x-amz-checksum-sha256"))
    status, got, cut = await read_until_cut(node.url + "/big.bin", {**RESUME, DIGEST_HEADER: wrong})
    await node.node.settled()
    assert (status, got, cut) == (206, SIZE - AT, False)
    assert key_of("/big.bin") in node.node.store


@pytest.mark.parametrize("right", [True, False], ids=["right-bytes", "wrong-bytes"])
async def test_a_resumes_206_is_checked_whole_against_its_repr_digest_and_stored_without_its_parts_fields(
        parallel_origin, make_node, right):
    """Repr-Digest names the representation whatever part a 206 carries (RFC
    9530 §3): the fill the 206 leads checks the whole object against it. The
    part's Content-MD5 is not stored with the object's 200."""
    body = pattern(SIZE)
    named = body if right else pattern(SIZE, seed=1)
    origin = await parallel_origin(body, extra={"Repr-Digest": repr_digest(named),
                                                "Content-MD5": base64.b64encode(b"\0" * 16).decode()})
    node = await node_for(make_node, origin)
    with capture_logs() as logs:
        status, got, cut = await read_until_cut(node.url + "/big.bin", RESUME)
        await node.node.settled()
    assert status == 206
    if right:
        assert (got, cut) == (SIZE - AT, False)
        [done] = [e for e in logs if e["event"] == "fill_completed"]
        assert done["verified"] == "Repr-Digest"
        stored = node.node.store.lookup(key_of("/big.bin"))
        assert stored is not None and "content-md5" not in {n.lower() for n, _ in stored.headers}
        assert ("Repr-Digest", repr_digest(body)) in stored.headers
    else:
        assert cut and got < SIZE - AT
        assert key_of("/big.bin") not in node.node.store
        assert node.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1
