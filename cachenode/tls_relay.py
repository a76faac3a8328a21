"""Port 443 of a cache node: TLS connections passed, untouched, to the real host.

The webhook aliases a dataset host to the cache for every scheme at once;
without this, a job's `https://` download of an aliased name met a closed
port and failed instead of going direct. For a name the node's origin
table allows, the connection is relayed byte for byte to the real host,
chosen by the ClientHello's server name (cachenode/tls_hello.py): no
termination, no caching, the client verifies the real host's certificate.
Any other name, or none, gets a fatal TLS alert and nothing is contacted,
so the port is never a tunnel to anywhere.

The bytes are copied through user space with large reads; splice(2) is
left for when TLS termination lands and this path is measured.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import structlog
from yarl import URL

from cachenode.tls_hello import HANDSHAKE_FAILURE, UNRECOGNIZED_NAME, NotClientHello, alert, read_client_hello

log = structlog.get_logger("nezha.tls")

_CHUNK = 256 * 1024


class _Counts(dict):
    """Outcomes counted here and passed on (the node's Prometheus counter)."""

    def __init__(self, on_outcome: Callable[[str], None] | None) -> None:
        super().__init__(relayed=0, refused=0, failed=0)
        self._on_outcome = on_outcome

    def __setitem__(self, outcome: str, value: int) -> None:
        super().__setitem__(outcome, value)
        if self._on_outcome is not None:
            self._on_outcome(outcome)


def passthrough_target(host: str, upstream: str) -> tuple[str, int]:
    """Where a TLS connection for origin `host` goes: the upstream's own host
    and port when it is https://, else the host's own port 443 (an http://
    upstream says nothing about where its TLS side is). Pure."""
    u = URL(upstream)
    if u.scheme == "https" and u.host:
        return u.host, u.port or 443
    return host, 443


class TlsRelay:
    """Accepts TLS connections and relays each to `target_for(server_name)`.

    `target_for` returns (host, port) for an allowed name and None otherwise.
    """

    def __init__(self, target_for: Callable[[str], tuple[str, int] | None], *, hello_timeout: float = 30.0,
                 connect_timeout: float = 5.0, on_outcome: Callable[[str], None] | None = None,
                 backlog: int = 1024) -> None:
        self.target_for = target_for
        self.hello_timeout = hello_timeout
        self.connect_timeout = connect_timeout
        self.counts = _Counts(on_outcome)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0
        self.backlog = backlog

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accepted, host, port, reuse_address=True, backlog=self.backlog)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, OSError):
            pass  # the client went away
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = f"{peer[0]}:{peer[1]}" if peer else "?"
        buf = bytearray()
        try:
            async with asyncio.timeout(self.hello_timeout):
                while (hello := read_client_hello(buf)) is None:
                    data = await reader.read(16384)
                    if not data:
                        return  # closed before saying anything routable
                    buf += data
        except TimeoutError:
            log.info("tls_refused", client=client, name=None, reason=f"no ClientHello within {self.hello_timeout:g} s")
            self.counts["refused"] += 1
            return
        except NotClientHello as e:
            log.info("tls_refused", client=client, name=None, reason=str(e))
            self.counts["refused"] += 1
            return
        name = hello.server_name
        target = self.target_for(name) if name else None
        if target is None:
            writer.write(alert(UNRECOGNIZED_NAME if name else HANDSHAKE_FAILURE))
            await writer.drain()
            log.info("tls_refused", client=client, name=name,
                     reason="no server name (SNI)" if not name else "not a configured origin")
            self.counts["refused"] += 1
            return
        try:
            async with asyncio.timeout(self.connect_timeout):
                up_reader, up_writer = await asyncio.open_connection(*target)
        except (OSError, TimeoutError) as e:
            log.warning("tls_relay_failed", client=client, name=name, target=f"{target[0]}:{target[1]}",
                        error=f"{type(e).__name__}: {e}"[:300])
            self.counts["failed"] += 1
            return
        started = time.monotonic()
        try:
            up_writer.write(bytes(buf))
            sent = await _pipe_both(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()
        self.counts["relayed"] += 1
        log.info("tls_relayed", client=client, name=name, target=f"{target[0]}:{target[1]}",
                 bytes_up=sent[0] + len(buf), bytes_down=sent[1], seconds=round(time.monotonic() - started, 3))


async def _pipe_both(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     up_r: asyncio.StreamReader, up_w: asyncio.StreamWriter) -> tuple[int, int]:
    """Copy both ways until both sides have ended; an end on one side is a
    half-close on the other, so a client that shuts down writing after its
    request still gets the whole answer."""
    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> int:
        moved = 0
        try:
            while data := await src.read(_CHUNK):
                dst.write(data)
                moved += len(data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, OSError):
            dst.transport.abort()
        return moved

    up, down = await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))
    return up, down
