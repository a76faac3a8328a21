"""Many clients, one origin fetch, and every client streamed while it fills."""

import asyncio
import hashlib

import pytest

from tests.integration.cachenode.conftest import hang_up_after

PATH = "/~kriz/cifar-100-python.tar.gz"


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile", "read-write"])
async def test_fifty_concurrent_cold_requests_make_one_origin_request(origin, make_node, session, sendfile):
    body = hashlib.sha256(b"x").digest() * 40000  # 1.28 MB
    origin.put(PATH, body, rate=8_000_000)
    node = await make_node(sendfile=sendfile)
    results = await asyncio.gather(*(node.get(session, PATH) for _ in range(50)))
    assert origin.requests[PATH] == 1
    assert all(status == 200 for status, _, _ in results)
    assert all(got == body for _, _, got in results)


async def test_clients_receive_bytes_before_the_fill_completes(origin, make_node, session):
    body = b"a" * 600_000
    origin.put(PATH, body, rate=400_000)  # 1.5 s for the whole object
    node = await make_node()
    async with session.get(node.url + PATH, headers={"Host": "www.cs.toronto.edu"}) as r:
        first = await asyncio.wait_for(r.content.readexactly(1000), timeout=1.0)
        assert node.node.flights.get("http://www.cs.toronto.edu" + PATH) is not None, "fill already over"
        rest = await r.read()
    assert first + rest == body


async def test_late_waiter_gets_bytes_already_streamed(origin, make_node, session):
    body = bytes(range(256)) * 2000
    origin.put(PATH, body, rate=1_000_000)
    node = await make_node()
    first = asyncio.ensure_future(node.get(session, PATH))
    await asyncio.sleep(0.25)  # about half the object is on disk by now
    late = await node.get(session, PATH)
    assert late[2] == body and (await first)[2] == body
    assert late[1]["X-Nezha-Cache"] == "miss-joined"
    assert origin.requests[PATH] == 1


async def test_client_disconnect_mid_fill_leaves_other_clients_unaffected(origin, make_node, session):
    body = b"z" * 800_000
    origin.put(PATH, body, rate=1_000_000)
    node = await make_node()
    other = asyncio.ensure_future(node.get(session, PATH))
    await hang_up_after(node, PATH, 10_000)
    status, _, got = await other
    assert status == 200 and got == body
    await node.node.settled()
    status, headers, got = await node.get(session, PATH)
    assert got == body and headers["X-Nezha-Cache"] == "hit"
    assert origin.requests[PATH] == 1


async def test_origin_without_content_length_is_streamed_chunked_and_stored(origin, make_node, session):
    body = b"q" * 300_000
    origin.put(PATH, body, chunked=True)
    node = await make_node()
    assert (await node.get(session, PATH))[2] == body
    await node.node.settled()
    status, headers, got = await node.get(session, PATH)
    assert got == body and headers["X-Nezha-Cache"] == "hit" and headers["Content-Length"] == str(len(body))


def open_files_under(root) -> list[str]:
    import os

    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


async def test_no_descriptor_on_the_data_dir_outlives_its_fill_and_readers(origin, make_node, session):
    for i in range(10):
        origin.put(f"/fd/{i}", bytes([i]) * 200_000, die_after=100_000 if i % 3 == 0 else None)
    node = await make_node()
    await asyncio.gather(*(node.get(session, f"/fd/{i}") for i in range(10) for _ in range(3)),
                         return_exceptions=True)
    await node.node.settled()
    for i in range(10):
        if i % 3:  # the stored ones, read once more as hits
            await node.get(session, f"/fd/{i}")
    await asyncio.sleep(0.05)
    assert open_files_under(node.node.store.root) == []


async def test_no_descriptor_outlives_a_small_object_stored_at_once(origin, make_node, session):
    # A descriptor kept per object stored at once ran a node out of open files at 20,000 objects.
    for i in range(40):
        origin.put(f"/small/{i}", bytes([i]) * 4096, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    answers = await asyncio.gather(*(node.get(session, f"/small/{i}") for i in range(40) for _ in range(2)))
    assert all(got == bytes([i // 2]) * 4096 for i, (_, _, got) in enumerate(answers))
    await node.node.settled()
    assert len(node.node.store) == 40
    await asyncio.sleep(0.05)
    assert open_files_under(node.node.store.root) == []


async def test_client_hanging_up_mid_fill_is_logged_once_as_client_gone_with_its_bytes(
        origin, make_node, session, caplog):
    """A disconnect is an ordinary outcome: one info line, its bytes counted, no 500 and no traceback."""
    from structlog.testing import capture_logs

    body = b"z" * 800_000
    origin.put(PATH, body, rate=1_000_000)
    node = await make_node()
    with capture_logs() as logs:
        other = asyncio.ensure_future(node.get(session, PATH))
        await hang_up_after(node, PATH, 10_000)
        status, _, got = await other
        await node.node.settled()
    assert status == 200 and got == body
    gone = [e for e in logs if e["event"] == "client_gone"]
    assert len(gone) == 1 and gone[0]["log_level"] == "info", logs
    assert 10_000 <= gone[0]["bytes"] < len(body)
    done = sorted((e["status"], e["bytes"]) for e in logs if e["event"] == "request_completed")
    assert done == [(200, gone[0]["bytes"]), (200, len(body))]
    assert not [e for e in logs if e["log_level"] in ("warning", "error", "critical")], logs
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    async with session.get(node.url + "/metrics") as r:
        assert f"nezha_bytes_served_total {float(len(body) + gone[0]['bytes'])}" in await r.text()
    assert node.node.store.lookup("http://www.cs.toronto.edu" + PATH) is not None


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_streaming_miss_answers_validators_like_a_hit(origin, make_node, session, chunked):
    """If-None-Match matching the fill's ETag is a 304, a failed If-Match a 412, while the object streams."""
    body = b"v" * 600_000
    origin.put(PATH, body, rate=1_000_000, chunked=chunked)
    etag = origin.etags[PATH]
    node = await make_node()
    status, headers, got = await node.get(session, PATH, headers={"If-None-Match": etag})
    assert (status, got, headers["X-Nezha-Cache"], headers["ETag"]) == (304, b"", "miss", etag)
    assert node.node.flights.get("http://www.cs.toronto.edu" + PATH) is not None, "fill already over"
    status, headers, got = await node.get(session, PATH, headers={"If-Match": '"something-else"'})
    assert (status, got, headers["X-Nezha-Cache"]) == (412, b"", "miss-joined")
    status, headers, got = await node.get(session, PATH, headers={"If-Match": etag})
    assert (status, got, headers["X-Nezha-Cache"]) == (200, body, "miss-joined")
    await node.node.settled()
    assert origin.requests[PATH] == 1
    status, headers, got = await node.get(session, PATH, headers={"If-None-Match": etag})
    assert (status, headers["X-Nezha-Cache"]) == (304, "hit")
