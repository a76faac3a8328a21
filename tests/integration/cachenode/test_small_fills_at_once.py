"""Small cold fills stored at once (`fill/lead.py` `stored_at_once`,
`AtOnce.store_whole`): a small answer whose whole body came with its head
is stored before its clients are answered, from the stored file, as a miss;
every promise of a streamed fill still holds for it (one origin request per
key, Vary, digests checked, a disk that refuses it, counts and logs), and a
small body the origin trickles is streamed as it comes, as before."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import os

from aiohttp import web
from structlog.testing import capture_logs

from tests.integration.cachenode.conftest import HOST, key_of

PATH = "/train/n01440764/n01440764_10026.JPEG"
BODY = os.urandom(20_000)  # an ImageNet JPEG's order of size


def fills(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "fill_completed"]


def temp_files(node) -> list:
    return list(node.node.store.tmp.iterdir())


async def test_a_small_cold_miss_is_stored_before_its_answer_and_served_exact(origin, make_node, session):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    with capture_logs() as logs:
        status, headers, body = await node.get(session, PATH)
    assert (status, headers["X-Nezha-Cache"], body) == (200, "miss", BODY)
    assert "Age" not in headers  # the origin's answer to this request, as a streamed miss: no Age of its own
    # No settling: it was stored before the first byte left.
    assert key_of(PATH) in node.node.store and temp_files(node) == []
    [fill] = fills(logs)
    assert fill["at_once"] is True and fill["bytes"] == len(BODY) and fill["source"] == "origin"
    status, headers, body = await node.get(session, PATH)
    assert (status, headers["X-Nezha-Cache"], body) == (200, "hit", BODY)
    assert headers["Age"].isdigit()
    assert origin.requests[PATH] == 1
    assert node.node.metrics.registry.get_sample_value("nezha_bytes_from_origin_total") == len(BODY)


async def test_a_small_body_the_origin_trickles_is_streamed_as_it_comes(origin, make_node, session):
    origin.put(PATH, BODY, rate=100_000)  # 5 pieces of 5,000 bytes, 50 ms apart
    node = await make_node()
    with capture_logs() as logs:
        async with session.get(node.url + PATH, headers={"Host": HOST}) as r:
            first = await r.content.readany()
            # The first piece reached the client while the origin still sends the rest.
            assert 0 < len(first) < len(BODY) and key_of(PATH) not in node.node.store
            body = first + await r.read()
        await node.node.settled()
    assert body == BODY and key_of(PATH) in node.node.store
    [fill] = fills(logs)
    assert "at_once" not in fill


async def test_many_clients_of_one_small_cold_object_cost_the_origin_one_request(origin, make_node, session):
    origin.put(PATH, BODY, delay=0.2)  # every client asks before the origin answers
    node = await make_node()
    answers = await asyncio.gather(*(node.get(session, PATH) for _ in range(20)))
    assert all(status == 200 and body == BODY for status, _, body in answers)
    labels = sorted(headers["X-Nezha-Cache"] for _, headers, _ in answers)
    assert labels.count("miss") == 1 and set(labels) <= {"miss", "miss-joined", "hit"}
    assert origin.requests[PATH] == 1


async def test_each_variant_of_a_small_object_is_stored_at_once_under_its_own_field(origin, make_node, session):
    origin.put(PATH, BODY, headers={"Vary": "Accept-Language", "Cache-Control": "max-age=3600"})
    node = await make_node()
    for language in ("en", "fr"):
        status, headers, body = await node.get(session, PATH, headers={"Accept-Language": language})
        assert (status, headers["X-Nezha-Cache"], body) == (200, "miss", BODY)
    for language in ("en", "fr"):
        _, headers, _ = await node.get(session, PATH, headers={"Accept-Language": language})
        assert headers["X-Nezha-Cache"] == "hit"
    assert origin.requests[PATH] == 2


def sha256_field(body: bytes) -> dict[str, str]:
    return {"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(body).digest()).decode()}


async def test_small_wrong_bytes_are_never_stored_nor_sent_and_the_next_request_fetches_again(
        origin, make_node, session):
    wrong = BODY[:1000] + bytes([BODY[1000] ^ 0x01]) + BODY[1001:]
    origin.put(PATH, wrong, headers=sha256_field(BODY))
    node = await make_node()
    with capture_logs() as logs:
        status, _, body = await node.get(session, PATH)
    assert status == 502 and b"not what it published" in body and wrong not in body
    assert key_of(PATH) not in node.node.store and temp_files(node) == []
    [event] = [e for e in logs if e["event"] == "digest_mismatch"]
    assert event["key"] == key_of(PATH) and event["origin"] == HOST
    assert node.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1

    origin.put(PATH, BODY, headers=sha256_field(BODY))
    with capture_logs() as logs:
        status, headers, body = await node.get(session, PATH)
    assert (status, headers["X-Nezha-Cache"], body) == (200, "miss", BODY)
    [fill] = fills(logs)
    assert fill["at_once"] is True and fill["verified"] == "x-amz-checksum-sha256"
    assert origin.requests[PATH] == 2 and key_of(PATH) in node.node.store


async def test_a_small_body_the_disk_refuses_still_reaches_its_client_whole_and_unstored(
        origin, make_node, session, monkeypatch):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with capture_logs() as logs:
        status, headers, body = await node.get(session, PATH)
        await node.node.settled()
    assert (status, headers["X-Nezha-Cache"], body) == (200, "miss", BODY)
    assert key_of(PATH) not in node.node.store and temp_files(node) == []
    failures = [e for e in logs if e["event"] == "store_write_failed"]
    assert len(failures) == 1 and "No space left" in failures[0]["error"]
    assert not any(e["event"] in ("fill_failed", "stream_aborted", "fill_completed") for e in logs)


async def test_a_node_process_fills_hundreds_of_small_objects_at_once_each_exact_then_hits(
        aiohttp_server, node_process, session):
    bodies = {f"/d/{n}.bin": n.to_bytes(4, "big") + os.urandom(16 * 1024 - 4) for n in range(300)}
    asked: dict[str, int] = {}

    async def answer(request: web.Request) -> web.Response:
        # Head and body in one write, as a static-file server sends a small file:
        # the node reads it whole with its head.
        asked[request.path] = asked.get(request.path, 0) + 1
        return web.Response(body=bodies[request.path], headers={"Cache-Control": "max-age=3600"})

    app = web.Application()
    app.router.add_get("/d/{name}", answer)
    origin = await aiohttp_server(app)
    node = node_process(str(origin.make_url("")).rstrip("/"))
    await node.ready(session)
    url = f"http://127.0.0.1:{node.port}"
    gate = asyncio.Semaphore(32)

    async def get(path: str) -> tuple[int, str, bytes]:
        async with gate, session.get(url + path, headers={"Host": HOST}) as r:
            return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read()

    cold = await asyncio.gather(*(get(path) for path in bodies))
    assert [(status, label, body) for status, label, body in cold] == [(200, "miss", b) for b in bodies.values()]
    warm = await asyncio.gather(*(get(path) for path in bodies))
    assert [(status, label, body) for status, label, body in warm] == [(200, "hit", b) for b in bodies.values()]
    assert asked == {path: 1 for path in bodies}
    at_once = [e for e in node.events() if e.get("event") == "fill_completed" and e.get("at_once")]
    assert len(at_once) == len(bodies)
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    assert f"nezha_cache_misses_total {len(bodies)}.0" in text, text[:2000]


async def test_a_cold_range_of_a_small_object_is_cut_from_the_bytes_just_stored(origin, make_node, session):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    status, headers, body = await node.get(session, PATH, headers={"Range": "bytes=100-4195"})
    assert (status, headers["X-Nezha-Cache"], body) == (206, "miss", BODY[100:4196])
    assert headers["Content-Range"] == f"bytes 100-4195/{len(BODY)}"
    assert origin.requests[PATH] == 1 and key_of(PATH) in node.node.store
    status, headers, body = await node.get(session, PATH, method="HEAD")
    assert (status, headers["X-Nezha-Cache"], headers["Content-Length"], body) == (200, "hit", str(len(BODY)), b"")
