"""A fill's pages are sent to disk behind its writers, so the commit's fsync
finds little left: every write path of the store counts toward it."""

from __future__ import annotations

import asyncio
import os
import threading

import aiohttp
import pytest
from aiohttp import web

from cachenode.kernel import splice
from cachenode.store import writeback
from cachenode.store.disk import Store

MiB = 1 << 20


@pytest.fixture
def small_step(monkeypatch):
    monkeypatch.setattr(writeback, "STEP", MiB)
    return MiB


class Kicks(list):
    fds: list[int]

    def __init__(self) -> None:
        super().__init__()
        self.fds = []


@pytest.fixture
def kicks(monkeypatch):
    """The inode of the file each writeback request was for; the descriptors in `kicks.fds`."""
    seen = Kicks()
    real = writeback.start

    def recording(fd: int) -> bool:
        seen.append(os.fstat(fd).st_ino)
        seen.fds.append(fd)
        return real(fd)

    monkeypatch.setattr(writeback, "start", recording)
    return seen


def test_the_kernel_takes_a_writeback_request_for_an_open_file_and_refuses_a_closed_one(tmp_path):
    assert writeback.available()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"x" * MiB)
    assert writeback.start(fd) is True
    os.close(fd)
    assert writeback.start(-1) is False  # EBADF: advice that failed, not an exception


def test_a_writer_never_waits_for_a_writeback_request_and_a_file_asks_again_only_after_it(tmp_path, monkeypatch):
    """The request can block on a full disk queue; writers must go on."""
    release, began = threading.Event(), threading.Event()

    def slow_start(fd: int) -> bool:
        began.set()
        release.wait(10)
        return True

    monkeypatch.setattr(writeback, "start", slow_start)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        behind = writeback.WriteBehind(fd, step=1000)
        behind.wrote(1000)
        assert began.wait(5)
        for _ in range(50):  # five more steps while the first request is stuck
            behind.wrote(100)
        assert behind.kicks == 1 and behind.pending == 5000
        release.set()
        writeback.drain()
        behind.wrote(1)  # the bytes written meanwhile were not forgotten
        writeback.drain()
        assert behind.kicks == 2 and behind.pending == 1
    finally:
        release.set()
        writeback.drain()
        os.close(fd)


def test_writers_on_many_threads_lose_no_count_and_each_request_has_its_own_descriptor(tmp_path, kicks):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        behind = writeback.WriteBehind(fd, step=1000)
        threads = [threading.Thread(target=lambda: [behind.wrote(10) for _ in range(1000)]) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        writeback.drain()
        assert 1 <= behind.kicks <= 80 and len(kicks) == behind.kicks
        assert set(kicks) == {os.fstat(fd).st_ino}
        assert fd not in kicks.fds
        for used in kicks.fds:  # each duplicate is closed after its request
            with pytest.raises(OSError):
                os.fstat(used)
    finally:
        os.close(fd)


async def test_sequential_and_positional_writes_start_writeback_as_they_go(tmp_path, small_step, kicks):
    store = Store(tmp_path / "s")
    await store.open()
    temp = await store.new_temp()
    os.close(temp.read_fd)
    inode = os.fstat(temp.fd).st_ino
    for _ in range(3):
        await store.write(temp, b"a" * (MiB // 2))
    await asyncio.to_thread(writeback.drain)
    assert kicks == [inode]  # 1.5 MiB: one step
    for at in (4, 5):
        await store.write_at(temp, at * MiB, b"b" * MiB)
        await asyncio.to_thread(writeback.drain)
    assert kicks == [inode] * 3  # 3.5 MiB
    await store.discard(temp)


async def test_a_body_spliced_into_the_file_starts_writeback_as_it_lands(tmp_path, small_step, kicks):
    body = os.urandom(8 * MiB)

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/o", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    store = Store(tmp_path / "s")
    await store.open()
    temp = await store.new_temp()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/o") as response:
                taken = splice.take(response)
                if taken is None:
                    pytest.fail("this loop and platform should let a fill splice its body")
                head = taken.buffered  # what aiohttp read with the headers, written as a fill does
                await store.write_at(temp, 0, head)
                moved: list[int] = []
                try:
                    n = await store.pump_into(temp, taken, len(head), end=lambda: len(body), moved=moved.append,
                                              read_timeout=10)
                finally:
                    taken.close()
        await asyncio.to_thread(writeback.drain)
        assert len(head) < MiB and n == len(body) - len(head) == sum(moved)
        # One request per MiB landed, fewer when one was still waiting as the next step passed.
        assert 1 <= len(kicks) <= len(body) // MiB and set(kicks) == {os.fstat(temp.fd).st_ino}
        with open(temp.path, "rb") as f:
            assert f.read() == body
    finally:
        os.close(temp.read_fd)
        await store.discard(temp)
        await runner.cleanup()

