"""Issue 14: what the node cannot prove shareable, whole or stored is streamed, never served as a hit.

Three ways a response used to end up stored (or cut) wrongly, each proved on
real sockets against a node on 127.0.0.1:

- a second `Cache-Control` or `Vary` line that makes the response one
  client's own (RFC 9110 §5.3: repeated lines are one list);
- a body delimited only by the origin closing its connection (RFC 9112
  §6.3), which is indistinguishable from one the origin cut short;
- a store that cannot write (a full disk): the body is streamed through
  unstored instead of the client getting 200 headers and a cut.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict
from structlog.testing import capture_logs

from cachenode.fill.buffer import Fill, StoreUnwritable
from cachenode.fill.flights import Flights, flight_fill, run_fill_in_background
from cachenode.http.headers import delimited_by_close
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.config import Origin
from nezha.errors import FillAborted
from tests.integration.cachenode.conftest import HOST, RawOrigin, until

PATH = "/data/shard-00.bin"
KEY = f"http://{HOST}{PATH}"
BODY = bytes(range(256)) * 12_000  # 3,072,000 bytes, every offset distinguishable mod 256

async def fetch(node, session: aiohttp.ClientSession, *, headers=None) -> tuple[int, str, bytes]:
    """Status, X-Nezha-Cache and body of one GET of PATH through the node."""
    sent = CIMultiDict({"Host": HOST})
    sent.extend(headers or [])
    async with session.get(node.url + PATH, headers=sent) as r:
        return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read()


# -- (a) repeated field lines --------------------------------------------------------------------

@pytest.mark.parametrize("fast_hits", [True, False], ids=["fast-path", "aiohttp"])
@pytest.mark.parametrize("fields", [
    [("Cache-Control", "max-age=3600"), ("Cache-Control", "private")],
    [("Cache-Control", "max-age=3600"), ("Cache-Control", "no-store")],
    [("Cache-Control", "max-age=3600"), ("Vary", "Accept-Encoding"), ("Vary", "*")],
    [("Cache-Control", "max-age=3600"), ("Vary", "Accept-Encoding, *")],
], ids=["private", "no-store", "vary-star-line", "vary-star-member"])
async def test_a_second_line_that_makes_a_response_unshareable_keeps_it_from_the_next_client(
        origin, make_node, session, fields, fast_hits):
    """The issue's examples: each used to be stored from its first line and served to everyone."""
    origin.put(PATH, b"mine" * 1000, fields=fields)
    node = await make_node(fast_hits=fast_hits)
    for client in ("first", "second"):
        status, label, body = await fetch(node, session)
        assert status == 200 and body == b"mine" * 1000 and label == "pass", client
        await node.node.settled()
    assert origin.requests[PATH] == 2
    assert len(node.node.store) == 0


@pytest.mark.parametrize("request_fields", [
    [("Cache-Control", "max-stale"), ("Cache-Control", "no-cache")],
    [("Pragma", "x-trace"), ("Pragma", "no-cache")],
], ids=["cache-control", "pragma"])
async def test_a_clients_no_cache_on_a_second_line_makes_the_node_ask_the_origin(
        origin, make_node, session, request_fields):
    """RFC 9111 §5.2.1.4, §5.4: a client asking to validate on its second line is not served unvalidated."""
    origin.put(PATH, b"d" * 1000, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    assert (await fetch(node, session))[1] == "miss"
    await node.node.settled()
    status, label, body = await fetch(node, session, headers=request_fields)
    assert status == 200 and body == b"d" * 1000 and label == "revalidated"
    assert origin.requests[PATH] == 2


# -- (b) bodies delimited by the connection closing -----------------------------------------------

@pytest.mark.parametrize("status,pairs,method,expect", [
    (200, [], "GET", True),  # neither framing: the body ends where the connection does
    (200, [("Connection", "close")], "GET", True),
    (200, [("Content-Length", "5000")], "GET", False),
    (200, [("Transfer-Encoding", "chunked")], "GET", False),
    (200, [("Transfer-Encoding", "gzip, Chunked")], "GET", False),
    (200, [("Transfer-Encoding", "chunked, gzip")], "GET", True),  # RFC 9112 §6.3 item 4: read until close
    (200, [("Transfer-Encoding", "gzip")], "GET", True),
    (200, [("Transfer-Encoding", "gzip"), ("Transfer-Encoding", "chunked")], "GET", True),  # doubtful: not proven
    (200, [("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "gzip")], "GET", True),
    (200, [], "HEAD", False),
    (204, [], "GET", False),
    (304, [], "GET", False),
    (404, [], "GET", True),
])
def test_which_responses_end_only_where_their_connection_closes(status, pairs, method, expect):
    """RFC 9112 §6.3, read conservatively: only chunked framing or a Content-Length proves a body whole."""
    assert delimited_by_close(status, CIMultiDict(pairs), method=method) is expect


def served_by(raw: RawOrigin) -> list[Origin]:
    return [Origin(host=HOST, upstream=raw.url)]


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_a_body_the_origin_ends_by_closing_is_streamed_and_the_next_request_is_a_miss_again(
        raw_origin, make_node, session, version):
    """The issue's case: 5,000 bytes then a close may be a cut 10,000-byte object; it must never become a hit."""
    raw = await raw_origin(b"c" * 5000, version=version)
    node = await make_node(origins=served_by(raw))
    with capture_logs() as logs:
        for _ in range(2):
            status, label, body = await fetch(node, session)
            assert status == 200 and body == b"c" * 5000 and label == "miss"
            await node.node.settled()
    assert raw.requests == 2
    assert len(node.node.store) == 0 and list(node.node.store.tmp.iterdir()) == []
    reasons = [e["reason"] for e in logs if e["event"] == "response_not_stored"]
    assert len(reasons) == 2 and all("connection closed" in r for r in reasons)


async def joined_clients(session: aiohttp.ClientSession, node, n: int) -> list[asyncio.Task]:
    """`n` clients of PATH, each holding the start of its body: all joined to one fill."""
    started: list[bool] = []

    async def client() -> tuple[int, bytes]:
        async with session.get(node.url + PATH, headers={"Host": HOST}) as r:
            head = await r.content.readexactly(1000)
            started.append(True)
            return r.status, head + await r.read()

    clients = [asyncio.create_task(client()) for _ in range(n)]
    await until(lambda: len(started) == n)
    return clients


async def test_clients_joined_to_a_close_delimited_fill_all_get_its_whole_stream(raw_origin, make_node, session):
    """Coalescing still holds: one origin request, every joiner gets every byte, nothing is kept."""
    raw = await raw_origin(BODY, hold_after=64 * 1024)
    node = await make_node(origins=served_by(raw))
    clients = await joined_clients(session, node, 3)
    assert raw.requests == 1
    raw.release.set()
    for status, body in await asyncio.gather(*clients):
        assert status == 200 and body == BODY
    await node.node.settled()
    assert raw.requests == 1
    assert len(node.node.store) == 0 and list(node.node.store.tmp.iterdir()) == []


async def test_a_framed_body_from_the_same_kind_of_origin_is_still_stored(raw_origin, make_node, session):
    """The counterpart: with a Content-Length a short body is an error, so a whole one may be kept."""
    raw = await raw_origin(b"c" * 5000, framing="length")
    node = await make_node(origins=served_by(raw))
    labels = []
    for _ in range(2):
        status, label, body = await fetch(node, session)
        assert status == 200 and body == b"c" * 5000
        labels.append(label)
        await node.node.settled()
    assert labels == ["miss", "hit"] and raw.requests == 1


# -- (c) a store that cannot write -----------------------------------------------------------------

class SmallDisk:
    """A data directory whose file system takes only so many more bytes.

    "tmpfs": a real file system (a tmpfs mount, so root only) filled with a
    filler file. "injected": the store's writes into files (os.pwrite, and
    os.splice into a file at an offset: a fill's body moved by the kernel)
    fail with ENOSPC once a byte budget is spent, as the kernel does, after
    a short write.
    """

    def __init__(self, kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kind = kind
        self.root = root
        self.monkeypatch = monkeypatch
        self.mounted = False

    def data_dir(self, *, size: int) -> Path:
        self.root.mkdir()
        if self.kind == "tmpfs":
            if os.geteuid() != 0:
                pytest.skip("mounting a tmpfs needs root")
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "nezha-test", str(self.root)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
            self.mounted = True
        return self.root / "node"

    def fill(self, *, leave: int) -> None:
        """From now on about `leave` more bytes fit."""
        if self.kind == "tmpfs":
            with open(self.root / "filler", "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 4096)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
            os.truncate(self.root / "filler", max(0, os.path.getsize(self.root / "filler") - leave))
            return
        real_pwrite = os.pwrite
        budget = [leave]

        def pwrite(fd: int, data, offset: int) -> int:
            if budget[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = real_pwrite(fd, memoryview(data)[:budget[0]], offset)
            budget[0] -= n
            return n

        real_splice = os.splice

        def splice(src: int, dst: int, count: int, offset_src=None, offset_dst=None, flags: int = 0) -> int:
            if offset_dst is None:  # socket -> pipe: not the disk
                return real_splice(src, dst, count, offset_src, offset_dst, flags)
            if budget[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = real_splice(src, dst, min(count, budget[0]), offset_src, offset_dst, flags)
            budget[0] -= n
            return n

        self.monkeypatch.setattr(os, "pwrite", pwrite)
        self.monkeypatch.setattr(os, "splice", splice)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], check=False)


@pytest.fixture(params=["tmpfs", "injected"])
def small_disk(request, tmp_path, monkeypatch):
    disk = SmallDisk(request.param, tmp_path / "disk", monkeypatch)
    yield disk
    disk.unmount()


def no_files_left(store: Store) -> bool:
    return len(store) == 0 and list(store.tmp.iterdir()) == [] and [p for p in store.objects.rglob("*") if p.suffix in (".data", ".obj")] == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_every_cold_request_on_a_full_disk_gets_the_whole_body_unstored(
        small_disk, origin, make_node, session, chunked):
    """The issue's case: a healthy origin and a full disk answer 200 and every byte, not 200 and a cut."""
    node = await make_node(data_dir=small_disk.data_dir(size=256 * 1024))
    small_disk.fill(leave=0)
    origin.put(PATH, BODY, chunked=chunked, headers={"Cache-Control": "max-age=3600"})
    with capture_logs() as logs:
        for _ in range(2):
            status, label, body = await fetch(node, session)
            assert status == 200 and label == "miss" and body == BODY
            await node.node.settled()
    assert origin.requests[PATH] == 2
    assert no_files_left(node.node.store)
    failures = [e for e in logs if e["event"] == "store_write_failed"]
    assert len(failures) == 2 and all(e["key"] == KEY and "No space left" in e["error"] for e in failures)
    assert not any(e["event"] in ("fill_failed", "stream_aborted") for e in logs)


async def test_a_disk_that_fills_mid_body_hands_the_rest_over_from_memory(small_disk, origin, make_node, session):
    """The first megabyte lands on disk, the rest cannot: the client still gets every byte, in order."""
    node = await make_node(data_dir=small_disk.data_dir(size=1536 * 1024))
    small_disk.fill(leave=1024 * 1024)
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    with capture_logs() as logs:
        status, label, body = await fetch(node, session)
        await node.node.settled()
    assert status == 200 and label == "miss" and body == BODY
    assert [e["on_disk"] > 0 for e in logs if e["event"] == "store_write_failed"] == [True]
    assert no_files_left(node.node.store)


async def test_clients_joined_to_a_fill_the_disk_refuses_all_get_the_whole_body(
        small_disk, raw_origin, make_node, session):
    """Joiners read the fill's bytes from its file up to the failure and from memory after it."""
    raw = await raw_origin(BODY, framing="length", hold_after=32 * 1024)
    node = await make_node(data_dir=small_disk.data_dir(size=256 * 1024), origins=served_by(raw))
    small_disk.fill(leave=64 * 1024)
    clients = await joined_clients(session, node, 3)
    raw.release.set()
    for status, body in await asyncio.gather(*clients):
        assert status == 200 and body == BODY
    await node.node.settled()
    assert raw.requests == 1
    assert no_files_left(node.node.store)


# -- the fill's memory hand-over, in process -------------------------------------------------------

CHUNK = 16 * 1024


@pytest.fixture
async def store_taking(tmp_path, monkeypatch):
    """A store on a disk that takes `budget` more bytes (a short write, then ENOSPC)."""
    real_pwrite = os.pwrite

    async def make(budget: int) -> Store:
        store = Store(tmp_path / "store")
        await store.open()
        left = [budget]

        def pwrite(fd, data, offset):
            if left[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = real_pwrite(fd, memoryview(data)[:left[0]], offset)
            left[0] -= n
            return n

        monkeypatch.setattr(os, "pwrite", pwrite)
        return store

    return make


@pytest.fixture
async def refusing_store(store_taking):
    """A store on a disk that takes no byte at all."""
    return await store_taking(0)


def meta_for(url: str = "http://127.0.0.1:9" + PATH) -> Meta:
    return Meta(key=KEY, url=url, host=HOST, size=0, headers=(), stored_at=0.0, expires_at=3600.0)


async def drain(fill: Fill, reader, *, pause: int = 0) -> bytes:
    """What front/respond.py does with a fill: send from the reader's file up to
    `on_disk`, and from memory after it, reporting progress as it goes.
    `pause` yields to the loop that many times per step: a slow client."""
    got, offset = bytearray(), 0
    while True:
        available = await fill.wait_beyond(offset, reader=reader)
        if available <= offset:
            return bytes(got)
        if offset >= fill.on_disk:
            data = fill.from_memory(reader, offset, available)
        else:
            data = os.pread(reader.fileno(), min(available, fill.on_disk) - offset, offset)
        got += data
        offset += len(data)
        for _ in range(pause):
            await asyncio.sleep(0)


def source_of(body: bytes):
    async def chunks():
        for i in range(0, len(body), CHUNK):
            yield body[i:i + CHUNK]
    return chunks()


async def test_an_unstored_fill_reads_the_origin_no_further_than_its_window_ahead_of_the_slowest_reader(
        refusing_store):
    """The node never holds a whole object: a slow reader holds the origin back, as a pass-through would."""
    write = await refusing_store.writing().open()
    fill = Fill(key=KEY, headers=(), length=len(BODY), write=write, window=4 * CHUNK)
    fast, slow = fill.open_reader(), fill.open_reader()
    slow_sent = [0]
    ahead: list[int] = []

    async def source():
        for i in range(0, len(BODY), CHUNK):
            ahead.append(fill.written - slow_sent[0])
            yield BODY[i:i + CHUNK]

    async def slow_reader() -> bytes:
        got, offset = bytearray(), 0
        while offset < len(BODY):
            available = await fill.wait_beyond(offset, reader=slow)
            data = fill.from_memory(slow, offset, available)
            got += data
            offset += len(data)
            slow_sent[0] = offset
            for _ in range(20):
                await asyncio.sleep(0)
        return bytes(got)

    run = asyncio.create_task(fill.run(source(), store=refusing_store, meta=meta_for()))
    fast_got, slow_got = await asyncio.gather(drain(fill, fast), slow_reader())
    with pytest.raises(StoreUnwritable):
        await run
    assert fast_got == slow_got == BODY
    assert max(ahead) <= 4 * CHUNK + CHUNK


async def test_a_reader_that_takes_nothing_is_cut_off_and_the_others_get_every_byte(refusing_store):
    """One stalled client cannot stall the rest: after `patience` it is dropped, with a clean error."""
    write = await refusing_store.writing().open()
    fill = Fill(key=KEY, headers=(), length=len(BODY), write=write, window=4 * CHUNK, patience=0.05)
    stalled, reader = fill.open_reader(), fill.open_reader()

    run = asyncio.create_task(fill.run(source_of(BODY), store=refusing_store, meta=meta_for()))
    assert await drain(fill, reader) == BODY
    with pytest.raises(StoreUnwritable):
        await run
    with pytest.raises(FillAborted, match="took nothing"):
        fill.from_memory(stalled, 0, 1)


async def test_a_slow_reader_still_sending_from_the_file_is_waited_for_not_cut(store_taking):
    """Progress through the bytes on disk counts: only a reader that takes nothing is cut off."""
    store = await store_taking(8 * CHUNK)
    body = BODY[:32 * CHUNK]
    fill = Fill(key=KEY, headers=(), length=len(body), write=await store.writing().open(), window=2 * CHUNK,
                patience=5.0)
    slow, fast = fill.open_reader(), fill.open_reader()
    run = asyncio.create_task(fill.run(source_of(body), store=store, meta=meta_for()))
    slow_got, fast_got = await asyncio.gather(drain(fill, slow, pause=50), drain(fill, fast))
    with pytest.raises(StoreUnwritable):
        await run
    assert fill.on_disk == 8 * CHUNK
    assert slow_got == fast_got == body


async def test_a_reader_that_closes_its_file_no_longer_holds_the_fill_back(refusing_store):
    """A client that hung up needs no more bytes; the fill must not wait out its patience for it."""
    write = await refusing_store.writing().open()
    fill = Fill(key=KEY, headers=(), length=len(BODY), write=write, window=4 * CHUNK, patience=3600.0)
    gone, reader = fill.open_reader(), fill.open_reader()

    run = asyncio.create_task(fill.run(source_of(BODY), store=refusing_store, meta=meta_for()))
    draining = asyncio.create_task(drain(fill, reader))
    await until(lambda: fill.written > 4 * CHUNK)  # the window is full, and `gone` has read nothing
    gone.close()
    assert await asyncio.wait_for(draining, 10) == BODY  # a guard against a hang, not a measurement
    with pytest.raises(StoreUnwritable):
        await run


async def test_a_fill_the_store_refuses_lets_no_later_request_join_it(refusing_store):
    """Its first bytes are gone from memory: a later request must fetch for itself, not join and be cut."""
    flights = Flights()
    flight, leader = flights.lead_or_join(KEY)
    assert leader
    write = await refusing_store.writing().open()
    fill = flight_fill(flights, flight, key=KEY, headers=(), length=None, write=write)
    more = asyncio.Event()

    async def source():
        yield b"x" * CHUNK
        await more.wait()
        yield b"y" * CHUNK

    with capture_logs() as logs:
        background = asyncio.create_task(run_fill_in_background(
            flights, flight, fill, fill.run(source(), store=refusing_store, meta=meta_for())))
        await until(lambda: fill.written == CHUNK)
        assert flights.get(KEY) is None and not fill.finished
        more.set()
        await background
    assert fill.complete and isinstance(fill.error, StoreUnwritable)
    assert [e["event"] for e in logs] == ["store_write_failed"]  # once per fill, where it is handled
    assert list(refusing_store.tmp.iterdir()) == []


async def test_a_temp_file_that_cannot_even_be_created_still_streams_the_body(tmp_path):
    """Out of inodes or over quota, creating the fill's file fails: the body goes through from memory."""
    store = Store(tmp_path / "store")
    await store.open()
    store.tmp.rmdir()  # any failure to create the file in tmp/ (ENOSPC, EDQUOT, ENOENT...) alike
    fill = Fill(key=KEY, headers=(), length=len(BODY), write=await store.writing().open())
    reader = fill.open_reader()
    with capture_logs() as logs:
        run = asyncio.create_task(fill.run(source_of(BODY), store=store, meta=meta_for()))
        assert await drain(fill, reader) == BODY
        with pytest.raises(StoreUnwritable):
            await run
    assert [(e["event"], e["on_disk"]) for e in logs] == [("store_write_failed", 0)]
    assert "create" in logs[0]["error"]
    reader.close()
    fill.close_reader()
    assert len(store) == 0
