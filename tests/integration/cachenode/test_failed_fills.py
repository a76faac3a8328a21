"""A fill that fails leaves nothing servable and breaks its streams visibly."""

import asyncio

import aiohttp
import pytest

from tests.integration.cachenode.conftest import until

PATH = "/data/train.bin"


async def read_all(node, session, path):
    """Body bytes, or the exception a client sees when the stream breaks."""
    try:
        async with session.get(node.url + path, headers={"Host": "www.cs.toronto.edu"}) as r:
            return r.status, await r.read()
    except aiohttp.ClientError as e:
        return None, e


async def test_origin_dying_mid_fill_breaks_streams_and_next_request_refetches(origin, make_node, session):
    body = b"d" * 500_000
    origin.put(PATH, body, die_after=200_000)
    node = await make_node()
    results = await asyncio.gather(*(read_all(node, session, PATH) for _ in range(5)))
    for status, got in results:
        assert status is None and isinstance(got, aiohttp.ClientPayloadError), (status, got)
    await node.node.settled()
    assert "http://www.cs.toronto.edu" + PATH not in node.node.store
    origin.behaviour[PATH].die_after = None
    status, got = await read_all(node, session, PATH)
    assert status == 200 and got == body
    assert origin.requests[PATH] == 2


async def test_origin_lying_about_length_stores_nothing(origin, make_node, session):
    body = b"l" * 100_000
    origin.put(PATH, body, claim_length=150_000, die_after=100_000)
    node = await make_node()
    status, got = await read_all(node, session, PATH)
    assert isinstance(got, aiohttp.ClientPayloadError)
    await node.node.settled()
    assert len(node.node.store) == 0
    assert list((node.node.store.tmp).iterdir()) == []


async def test_chunked_origin_dying_breaks_the_chunked_stream(origin, make_node, session):
    origin.put(PATH, b"c" * 400_000, chunked=True, die_after=100_000)
    node = await make_node()
    status, got = await read_all(node, session, PATH)
    assert isinstance(got, aiohttp.ClientPayloadError)
    await node.node.settled()
    assert len(node.node.store) == 0


async def test_unreachable_origin_is_502_naming_the_origin(make_node, session):
    from nezha.config import Origin

    node = await make_node(origins=[Origin(host="www.cs.toronto.edu", upstream="http://127.0.0.1:9")])
    status, headers, got = await node.get(session, PATH)
    assert status == 502
    assert b"origin http://127.0.0.1:9/data/train.bin" in got and b"cannot connect" in got
    assert "cannot connect" in headers["X-Nezha-Origin-Error"]  # a relaying peer must not blame this node


async def test_silent_origin_is_504_naming_the_origin(origin, make_node, session):
    origin.put(PATH, b"s", delay=2.0)
    node = await make_node(origin_read_timeout=0.3)
    status, headers, got = await node.get(session, PATH)
    assert status == 504
    assert origin.url.encode() in got and b"timeout" in got
    assert "timeout" in headers["X-Nezha-Origin-Error"]


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_origin_errors_are_passed_on_and_not_cached(origin, make_node, session, status):
    origin.put(PATH, b"nope\n", status=status)
    node = await make_node()
    for _ in range(2):
        got_status, headers, got = await node.get(session, PATH)
        assert got_status == status and got == b"nope\n"
    assert origin.requests[PATH] == 2
    assert len(node.node.store) == 0


async def test_a_404_without_lifetime_or_validator_is_passed_on_and_not_cached(origin, make_node, session):
    """Heuristically cacheable (RFC 9111 §4.2.2), but with nothing to judge it by: never reusable."""
    node = await make_node()
    for _ in range(2):
        status, headers, got = await node.get(session, "/absent")
        assert status == 404 and got == b"no /absent\n" and headers["X-Nezha-Cache"] == "pass"
    assert origin.requests["/absent"] == 2
    assert len(node.node.store) == 0


@pytest.mark.parametrize("status", [404, 410, 301])
async def test_a_heuristically_cacheable_status_with_last_modified_is_stored_and_answered_with_its_status(
        origin, make_node, session, status):
    """404, 410, 301 ... may be reused on a heuristic lifetime (RFC 9111 §4.2.2); a hit keeps the status."""
    origin.put(PATH, b"gone\n", status=status, headers={"Location": "/elsewhere"} if status == 301 else {})
    node = await make_node()
    first = await node.get(session, PATH, headers={"Range": "bytes=0-1"})
    await node.node.settled()
    status2, headers, got = await node.get(session, PATH, headers={"Range": "bytes=0-1"})
    assert first[0] == status2 == status and got == b"gone\n", "Range applies to a 200 only"
    assert first[1]["X-Nezha-Cache"] == "miss" and headers["X-Nezha-Cache"] == "hit"
    if status == 301:
        assert headers["Location"] == "/elsewhere"
    assert origin.requests[PATH] == 1


async def test_a_failed_meta_write_closes_the_fill_file_once_and_leaves_no_data_file(tmp_path, monkeypatch):
    """commit closes the temp file before renaming; when the meta write then fails, the
    discard that follows must not close that number again: it may belong to another file."""
    import os
    import time

    from cachenode.fill.buffer import Fill
    from cachenode.store.disk import Store
    from cachenode.store.objects import Meta
    from nezha.errors import StoreError

    key = "http://www.cs.toronto.edu" + PATH
    store = Store(tmp_path / "s", small_max=0)  # the large format's meta write
    await store.open()
    write = await store.writing().open()
    fd_number = write.temp.fd
    bystander = tmp_path / "bystander"
    bystander.write_bytes(b"someone else's file")

    def failing_write_meta(meta_path, meta):
        # The number commit just closed is free; another open takes it, as any thread may.
        other = os.open(bystander, os.O_RDONLY)
        if other != fd_number:
            os.dup2(other, fd_number)
            os.close(other)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write_meta", failing_write_meta)

    async def body():
        yield b"x" * 1000

    fill = Fill(key=key, headers={}, length=1000, write=write)
    now = time.time()
    meta = Meta(key=key, url="http://127.0.0.1:9" + PATH, host="www.cs.toronto.edu", size=0, headers={},
                stored_at=now, expires_at=now + 60)
    with pytest.raises(StoreError, match="write meta"):
        await fill.run(body(), store=store, meta=meta)
    fill.close_reader()
    try:
        assert os.fstat(fd_number).st_ino == bystander.stat().st_ino, "the bystander's descriptor was closed"
    finally:
        os.close(fd_number)
    assert key not in store
    assert list(store.objects.rglob("*.data")) == [] and list(store.tmp.iterdir()) == []


async def test_exhausted_origin_pool_is_504_naming_the_origin_instead_of_waiting_forever(
        origin, make_node, session, monkeypatch):
    """With every pooled origin connection busy streaming, a new miss waits a bounded time for one."""
    import functools

    import cachenode.app
    from cachenode.fill.origin import OriginClient

    monkeypatch.setattr(cachenode.app, "OriginClient", functools.partial(OriginClient, limit=1, pool_timeout=0.3))
    origin.put("/slow", b"s" * 300_000, rate=150_000)  # holds the only connection for 2 s
    origin.put(PATH, b"t" * 100)
    node = await make_node(origin_connect_timeout=0.2)
    slow = asyncio.ensure_future(read_all(node, session, "/slow"))
    await until(lambda: origin.requests["/slow"] == 1)  # it holds the only connection
    status, headers, got = await node.get(session, PATH)
    assert status == 504, (status, got)
    assert (origin.url + PATH).encode() in got and b"all 1 connections" in got and b"busy" in got
    assert not slow.done(), "the miss waited for the busy connection instead of giving up"
    assert origin.requests[PATH] == 0
    assert await slow == (200, b"s" * 300_000)


def test_origin_client_refuses_pool_timeouts_that_cannot_work_naming_them():
    from cachenode.fill.origin import OriginClient

    with pytest.raises(ValueError, match=r"pool_timeout \(0\) must be positive"):
        OriginClient(connect_timeout=1, read_timeout=1, pool_timeout=0)
    with pytest.raises(ValueError, match=r"pool_timeout \(0.5\) must be at least connect_timeout \(1\)"):
        OriginClient(connect_timeout=1, read_timeout=1, pool_timeout=0.5)


def joiners_wake_after_the_fill_ends(node, monkeypatch):
    """Make every joiner resume only once the fill is over and has closed its reader:
    the order a loaded loop can produce when a fill ends right after the flight resolves."""
    respond = node.node.respond
    real_fill = respond.fill

    async def late_fill(request, fill, *, label):
        if label == "miss-joined":
            while fill.temp.read_fd >= 0:
                await asyncio.sleep(0.01)
        return await real_fill(request, fill, label=label)

    monkeypatch.setattr(respond, "fill", late_fill)


async def test_joiner_waking_after_the_fill_failed_gets_502_naming_the_origin(origin, make_node, session, monkeypatch):
    origin.put(PATH, b"f" * 300_000, delay=0.3, die_after=100_000)
    node = await make_node()
    joiners_wake_after_the_fill_ends(node, monkeypatch)
    leader = asyncio.ensure_future(read_all(node, session, PATH))
    await until(lambda: node.node.flights.get("http://www.cs.toronto.edu" + PATH) is not None)
    status, headers, got = await node.get(session, PATH)
    assert status == 502, (status, got)
    assert (origin.url + PATH).encode() in got and b"failed" in got
    assert isinstance((await leader)[1], aiohttp.ClientPayloadError)
    assert origin.requests[PATH] == 1


async def test_joiner_waking_after_the_fill_committed_is_served_the_stored_object(
        origin, make_node, session, monkeypatch):
    body = b"g" * 300_000
    origin.put(PATH, body, delay=0.3)
    node = await make_node()
    joiners_wake_after_the_fill_ends(node, monkeypatch)
    leader = asyncio.ensure_future(read_all(node, session, PATH))
    await until(lambda: node.node.flights.get("http://www.cs.toronto.edu" + PATH) is not None)
    status, headers, got = await node.get(session, PATH)
    assert (status, got, headers["X-Nezha-Cache"]) == (200, body, "miss-joined")
    assert await leader == (200, body)
    assert origin.requests[PATH] == 1


async def test_joiner_waking_after_an_unstored_fill_asks_the_origin_itself(origin, make_node, session, monkeypatch):
    body = b"h" * 300_000
    origin.put(PATH, body, delay=0.3, chunked=True)
    node = await make_node(capacity=100_000)
    joiners_wake_after_the_fill_ends(node, monkeypatch)
    leader = asyncio.ensure_future(read_all(node, session, PATH))
    await until(lambda: node.node.flights.get("http://www.cs.toronto.edu" + PATH) is not None)
    status, headers, got = await node.get(session, PATH)
    assert (status, got, headers["X-Nezha-Cache"]) == (200, body, "pass")
    assert await leader == (200, body)
    assert origin.requests[PATH] == 2
