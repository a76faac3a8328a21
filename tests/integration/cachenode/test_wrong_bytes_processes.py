"""Fault injection with real processes: an origin that sends the right length
of wrong bytes under each kind of digest it can publish, to a `nezha cache`
process (issue 37, "Tests that must exist").

Each kind: the client is cut before the end, nothing is stored, the
mismatch is logged and counted, and the next fill, of good bytes, is
served and stored (then a hit)."""

from __future__ import annotations

import base64
import hashlib
import re
import zlib

import aiohttp
import pytest
from awscrt import checksums

from tests.integration.cachenode.conftest import HOST

GOOD = bytes(range(251)) * 8000  # ~2 MB: spliced, one stream, more than one hashing step
WRONG = GOOD[:1_500_000] + bytes([GOOD[1_500_000] ^ 0x80]) + GOOD[1_500_001:]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def sf(name: str, raw: bytes) -> str:
    return f"{name}=:{b64(raw)}:"


# kind -> (the origin's fields for GOOD, the field the node names, the digest as it logs it)
KINDS = {
    "s3-crc32": ({"x-amz-checksum-crc32": b64(zlib.crc32(GOOD).to_bytes(4, "big"))}, "x-amz-checksum-crc32"),
    "s3-crc32c": ({"x-amz-checksum-crc32c": b64(checksums.crc32c(GOOD).to_bytes(4, "big"))},
                  "x-amz-checksum-crc32c"),
    "s3-crc64nvme": ({"x-amz-checksum-crc64nvme": b64(checksums.crc64nvme(GOOD).to_bytes(8, "big")),
                      "x-amz-checksum-type": "FULL_OBJECT"}, "x-amz-checksum-crc64nvme"),
    "s3-sha1": ({"x-amz-checksum-sha1": b64(hashlib.sha1(GOOD).digest())}, "x-amz-checksum-sha1"),
    "s3-sha256": ({"x-amz-checksum-sha256": b64(hashlib.sha256(GOOD).digest())}, "x-amz-checksum-sha256"),
    "gcs-crc32c": ({"x-goog-hash": f"crc32c={b64(checksums.crc32c(GOOD).to_bytes(4, 'big'))}"}, "x-goog-hash"),
    "gcs-md5": ({"x-goog-hash": f"md5={b64(hashlib.md5(GOOD).digest())}"}, "x-goog-hash"),
    "content-md5": ({"Content-MD5": b64(hashlib.md5(GOOD).digest())}, "Content-MD5"),
    "repr-digest-sha256": ({"Repr-Digest": sf("sha-256", hashlib.sha256(GOOD).digest())}, "Repr-Digest"),
    "repr-digest-sha512": ({"Repr-Digest": sf("sha-512", hashlib.sha512(GOOD).digest())}, "Repr-Digest"),
    "content-digest-sha256": ({"Content-Digest": sf("sha-256", hashlib.sha256(GOOD).digest())}, "Content-Digest"),
}
HF_PATH = "/org/model/resolve/main/model.safetensors"


async def get(node, session, path) -> tuple[int, int, str | None, BaseException | None]:
    """(status, body bytes received, X-Nezha-Cache, the error that cut the body or None)."""
    got = 0
    async with session.get(f"http://127.0.0.1:{node.port}{path}", headers={"Host": HOST}, allow_redirects=False) as r:
        try:
            async for chunk in r.content.iter_any():
                got += len(chunk)
        except aiohttp.ClientPayloadError as e:
            return r.status, got, r.headers.get("X-Nezha-Cache"), e
        return r.status, got, r.headers.get("X-Nezha-Cache"), None


async def mismatches(node, session) -> float:
    async with session.get(f"http://127.0.0.1:{node.port}/metrics") as r:
        text = await r.text()
    m = re.search(r'^nezha_digest_mismatches_total\{origin="%s"\} (\S+)$' % re.escape(HOST), text, re.M)
    assert m is not None, "no nezha_digest_mismatches_total for the origin"
    return float(m.group(1))


async def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    import asyncio
    import time
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_wrong_bytes_under_each_digest_are_cut_not_stored_counted_and_refetched(origin, node_process):
    """One node process, every kind in turn (a process each would cost seconds apiece)."""
    kinds = [*KINDS, "hugging-face-linked-etag"]
    for kind in kinds:
        fields = {} if kind == "hugging-face-linked-etag" else KINDS[kind][0]
        origin.put(f"/data/{kind}.bin", WRONG, headers=fields)
    origin.put(HF_PATH, b"", status=302, headers={
        "Location": f"http://{HOST}/data/hugging-face-linked-etag.bin",
        "X-Linked-Etag": f'"{hashlib.sha256(GOOD).hexdigest()}"', "Cache-Control": "no-store"})
    node = node_process(origin.url, args=("--fill-streams", "1"))
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        await node.ready(session)
        assert await mismatches(node, session) == 0
        for n, kind in enumerate(kinds, start=1):
            await wrong_then_right(origin, node, session, kind, mismatches_before=n - 1)


def events(node, name: str, path: str) -> list[dict]:
    return [e for e in node.events() if e["event"] == name and e.get("key", "").endswith(path)]


async def wrong_then_right(origin, node, session, kind: str, *, mismatches_before: int) -> None:
    path = f"/data/{kind}.bin"
    hf = kind == "hugging-face-linked-etag"
    fields, field = ({}, "X-Linked-ETag") if hf else KINDS[kind]
    if hf:
        assert (await get(node, session, HF_PATH))[0] == 302
    status, got, cache, error = await get(node, session, path)
    assert status == 200 and error is not None and got < len(GOOD), (kind, status, got, error)
    await wait_for(lambda: events(node, "digest_mismatch", path), f"{kind}: no digest_mismatch")
    [event] = events(node, "digest_mismatch", path)
    assert event["field"] == field and event["origin"] == HOST, (kind, event)
    assert event["expected"] != event["got"] and event["bytes"] == len(GOOD), (kind, event)
    assert await mismatches(node, session) == mismatches_before + 1, kind
    assert not [p for p in node.data_dir.rglob("*") if p.is_file() and p.stat().st_size == len(GOOD)
                and p.read_bytes() == WRONG], f"{kind}: wrong bytes were stored"

    origin.put(path, GOOD, headers=fields)
    if hf:
        await get(node, session, HF_PATH)
    assert await get(node, session, path) == (200, len(GOOD), "miss", None), kind
    await wait_for(lambda: events(node, "fill_completed", path), f"{kind}: no fill_completed")
    [stored] = events(node, "fill_completed", path)
    assert stored["verified"] == field, (kind, stored)
    assert await get(node, session, path) == (200, len(GOOD), "hit", None), kind
    assert await mismatches(node, session) == mismatches_before + 1, kind
    assert origin.requests[path] == 2, kind
