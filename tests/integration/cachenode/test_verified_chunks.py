"""A chunked object's whole read is checked against the digest the origin
published of the object: each chunk was filled by a Range request, which
carries no digest of the whole, so the node assembling a whole read for a
client hashes it in order and holds the last byte until it matches
(cachenode/chunks/whole.py; docs/cache-node.md, "Verified bytes")."""

from __future__ import annotations

import base64
import hashlib

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.integration.cachenode.conftest import HOST
from tests.integration.cachenode.test_chunks import BODY, CHUNKED, KEY, MiB, PATH, SIZE, chunk_bytes, settled

ETAG = '"v1"'
WRONG = BODY[:5 * MiB] + bytes([BODY[5 * MiB] ^ 0x01]) + BODY[5 * MiB + 1:]  # the right length, one bit off


def sha256_header(body: bytes) -> dict[str, str]:
    return {"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(body).digest()).decode()}


def crc64nvme_header(body: bytes) -> dict[str, str]:
    from awscrt import checksums
    return {"x-amz-checksum-crc64nvme": base64.b64encode(checksums.crc64nvme(body).to_bytes(8, "big")).decode()}


DIGESTS = {"sha256": sha256_header, "crc64nvme": crc64nvme_header}


def put(origin, body: bytes, digest: str) -> None:
    origin.put(PATH, body, etag=ETAG,
               headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600", **DIGESTS[digest](BODY)})


async def read(node, session, headers: dict[str, str] | None = None) -> tuple[int, int, str, bool]:
    """(status, bytes received, their sha256, whether the body was cut before its end)."""
    digest, got = hashlib.sha256(), 0
    async with session.get(node.url + PATH, headers={"Host": HOST, **(headers or {})}) as r:
        try:
            async for data in r.content.iter_chunked(1 << 20):
                digest.update(data)
                got += len(data)
        except aiohttp.ClientPayloadError:
            return r.status, got, digest.hexdigest(), True
        return r.status, got, digest.hexdigest(), False


def mismatches(nodes) -> float:
    return sum(nd.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() for nd in nodes.values())


@pytest.mark.parametrize("digest", list(DIGESTS))
async def test_a_chunked_object_of_wrong_bytes_is_cut_before_its_last_byte_forgotten_everywhere_and_read_right_next(
        origin, cluster, session, digest):
    """Right length, one bit off in chunk 1: the whole read is cut before its
    end, the mismatch logged and counted once, the manifest and every chunk
    of that version gone from every node; once the origin sends the right
    bytes (the same ETag), the next read fetches them and is whole."""
    put(origin, WRONG, digest)
    nodes, _ = await cluster(3, **CHUNKED)
    entry = next(iter(nodes.values()))
    with capture_logs() as logs:
        status, got, _, cut = await read(entry, session)
        await settled(nodes)
    assert status == 200 and cut and got < SIZE, (status, got, cut)
    [event] = [e for e in logs if e["event"] == "digest_mismatch"]
    assert (event["source"], event["key"], event["origin"]) == ("chunks", KEY, HOST)
    assert event["expected"] == f"{digest}:" + next(iter(DIGESTS[digest](BODY).values()))
    assert mismatches(nodes) == 1
    assert all(KEY not in nd.node.store for nd in nodes.values()), "the manifest of wrong chunks is kept"
    assert chunk_bytes(nodes) == {}, "chunks of the wrong object are kept"

    put(origin, BODY, digest)
    status, got, sha, cut = await read(entry, session)
    assert (status, got, sha, cut) == (200, SIZE, hashlib.sha256(BODY).hexdigest(), False)
    await settled(nodes)
    assert mismatches(nodes) == 1
    assert sum(chunk_bytes(nodes).values()) == SIZE


async def test_a_chunked_object_of_right_bytes_is_read_whole_through_every_node_and_a_range_is_not_checked(
        origin, cluster, session):
    """Right bytes pass the check on every node's whole read; a range is
    not the whole, so nothing checks it against the object's digest."""
    put(origin, BODY, "sha256")
    nodes, _ = await cluster(3, **CHUNKED)
    with capture_logs() as logs:
        for node in nodes.values():
            assert await read(node, session) == (200, SIZE, hashlib.sha256(BODY).hexdigest(), False)
        status, got, sha, cut = await read(next(iter(nodes.values())), session, {"Range": "bytes=100-199"})
        assert (status, got, sha, cut) == (206, 100, hashlib.sha256(BODY[100:200]).hexdigest(), False)
    assert [e for e in logs if e["event"] == "digest_mismatch"] == []
    assert mismatches(nodes) == 0
