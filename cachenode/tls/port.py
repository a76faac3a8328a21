"""Port 443 of a cache node: each TLS connection terminated, relayed or refused by its server name.

The webhook aliases a dataset host to the cache for every scheme at once,
so whatever a job sends to an aliased name's port 443 must be answered.
The ClientHello's server name (cachenode/tls/hello.py) decides, before a
single byte is consumed or answered:

- a configured origin, with a CA on this node (and the origin not marked
  `tls: passthrough`): the handshake is made here with a leaf certificate
  for exactly that name (cachenode/tls/certificates.py) and the connection becomes an
  ordinary client connection of the node, its requests keyed `https://`;
- a configured origin otherwise: the connection is relayed byte for byte to
  the real host, which the client verifies itself (no caching);
- any other name, or none, or no TLS: a fatal alert, nothing minted,
  nothing contacted, so the port is never a tunnel to anywhere.

The name is read with MSG_PEEK, so the bytes stay in the socket for
whichever of the three follows: the TLS layer reads the ClientHello itself
when the node terminates, the relay forwards it when it does not. Relayed
bytes move inside the kernel with splice(2) where the platform has it
(cachenode/kernel/splice.py), else through user space.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Union

import structlog
from yarl import URL

from cachenode.front.connections import Gate
from cachenode.kernel.fdwait import ready
from cachenode.kernel.splice import AVAILABLE as SPLICE_AVAILABLE
from cachenode.kernel.splice import splice_both
from cachenode.tls.hello import (HANDSHAKE_FAILURE, MAX_HELLO, UNRECOGNIZED_NAME, NotClientHello, alert,
                                 read_client_hello)
from nezha.wire import ParentFallback

log = structlog.get_logger("nezha.tls")

_CHUNK = 256 * 1024
# A ClientHello split over several segments is peeked again after a growing
# pause: the bytes stay queued, so the socket stays readable and waiting
# for readability alone would spin.
_PEEK_PAUSES = (0.001, 0.005, 0.02, 0.05)
# accept() errors that mean "out of a resource for now": wait, then accept again.
_ACCEPT_RETRY = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_ACCEPT_RETRY_S = 0.1


@dataclass(frozen=True)
class Terminate:
    """Make the handshake here with this context."""
    context: ssl.SSLContext


@dataclass(frozen=True)
class Relay:
    """Pass the connection untouched to this (host, port); to `fallback`
    instead when that cannot be reached (a sidecar's parent tier that is
    down: its origin then). The ClientHello is only peeked until a
    connection is made, so the fallback sees the connection from its start."""
    host: str
    port: int
    fallback: tuple[str, int] | None = None


Route = Union[Terminate, Relay]


class _Counts(dict):
    """Outcomes counted here and passed on (the node's Prometheus counter)."""

    def __init__(self, on_outcome: Callable[[str], None] | None) -> None:
        super().__init__(terminated=0, relayed=0, refused=0, failed=0)
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


class _Held:
    """A TLS-port connection as the node's connection `Gate` sees it: waiting
    (and so the first to give way at the cap) until its ClientHello is routed;
    a terminated one is then counted by its HTTP connection, a relayed one
    stays counted here until it ends."""

    def __init__(self) -> None:
        self.waiting = True
        self.waiting_since = time.monotonic()
        self.task: asyncio.Task | None = None
        self.reclaimed = False
        self.started = False  # its task began (and so closes the socket itself unless it hands it on)

    def reclaim(self) -> None:
        self.reclaimed = True
        if self.task is not None:
            self.task.cancel()


class TlsPort:
    """Accepts TLS connections and routes each by its server name.

    `route_for(name)` returns a Terminate or a Relay for a name the node
    serves, None for any other (it may raise to refuse too: the error is
    logged as the reason). `adopt(sock, context)` makes the handshake on an
    accepted socket and hands the connection to the node's HTTP server; it
    is needed only when `route_for` can return Terminate.
    """

    def __init__(self, route_for: Callable[[str], Route | None], *, hello_timeout: float = 30.0,
                 connect_timeout: float = 5.0, on_outcome: Callable[[str], None] | None = None,
                 on_fallback: Callable[[str], None] | None = None,
                 adopt: Callable[[socket.socket, ssl.SSLContext], Awaitable[None]] | None = None,
                 backlog: int = 1024, splice: bool = SPLICE_AVAILABLE, gate: Gate | None = None) -> None:
        self.route_for = route_for
        self.hello_timeout = hello_timeout
        self.connect_timeout = connect_timeout
        self.adopt = adopt
        self.counts = _Counts(on_outcome)
        self.on_fallback = on_fallback  # a relay went to its fallback, and why (timeout, unreachable)
        self.backlog = backlog
        self.splice = splice  # relayed bytes move inside the kernel; off: through user space
        # The node's connection cap (cachenode/front/connections.py), shared with the plain port.
        self.gate = gate
        self._sock: socket.socket | None = None
        self._acceptor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Listen; `reuse_port` when the node's other workers listen on the same port."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=self.backlog, reuse_port=reuse_port)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._acceptor = asyncio.get_running_loop().create_task(self._accept_forever())

    async def close(self) -> None:
        if self._acceptor is not None:
            self._acceptor.cancel()
            await asyncio.gather(self._acceptor, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        short = False
        while True:
            try:
                conn, addr = await loop.sock_accept(self._sock)
            except OSError as e:
                if e.errno not in _ACCEPT_RETRY:
                    raise
                if not short:
                    log.warning("tls_accept_paused", error=e.strerror, retry_s=_ACCEPT_RETRY_S)
                short = True
                await asyncio.sleep(_ACCEPT_RETRY_S)
                continue
            short = False
            conn.setblocking(False)
            held = _Held()
            if self.gate is not None and not self.gate.admit(held):
                conn.close()  # every connection is busy: no TLS alert could say more than a close
                self.counts["refused"] += 1
                continue
            task = loop.create_task(self._accepted(conn, addr, held))
            held.task = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            # A connection reclaimed before its task ran (one accept burst
            # admits many) is cancelled without `_accepted`'s finally: the
            # socket would stay open, holding the client, until the GC.
            task.add_done_callback(lambda _, c=conn, h=held: None if h.started else c.close())

    async def _accepted(self, conn: socket.socket, addr: tuple, held: "_Held") -> None:
        held.started = True
        client = f"{addr[0]}:{addr[1]}" if addr else "?"
        handed_on = False
        try:
            handed_on = await self._serve(conn, client, held)
        except (ConnectionError, OSError):
            pass  # the client went away
        except asyncio.CancelledError:
            if not held.reclaimed:
                raise
        finally:
            if self.gate is not None:
                self.gate.leave(held)
            if not handed_on:
                conn.close()

    async def _serve(self, conn: socket.socket, client: str, held: "_Held") -> bool:
        """Route one connection; True once its socket belongs to someone else."""
        try:
            async with asyncio.timeout(self.hello_timeout):
                hello = await _peek_hello(conn)
        except TimeoutError:
            return self._refused(client, None, f"no ClientHello within {self.hello_timeout:g} s")
        except NotClientHello as e:
            return self._refused(client, None, str(e), conn=conn)
        if hello is None:
            return False  # closed before saying anything routable
        name = hello.server_name
        if not name:
            return self._refused(client, None, "no server name (SNI)", send=alert(HANDSHAKE_FAILURE), conn=conn)
        try:
            route = self.route_for(name)
        except Exception as e:  # noqa: BLE001 - a refusal with its reason, e.g. a CA that cannot sign
            log.error("tls_route_failed", client=client, name=name, error=f"{type(e).__name__}: {e}"[:300])
            return self._refused(client, name, "no certificate could be made for it",
                                 send=alert(HANDSHAKE_FAILURE), conn=conn, outcome="failed")
        if route is None:
            return self._refused(client, name, "not a configured origin", send=alert(UNRECOGNIZED_NAME), conn=conn)
        held.waiting = False  # routed: from here it is busy, never the one to give way
        if isinstance(route, Terminate):
            assert self.adopt is not None, "route_for answered Terminate without an adopt()"
            try:
                await self.adopt(conn, route.context)
            except (ssl.SSLError, ConnectionError, OSError, TimeoutError) as e:
                log.info("tls_handshake_failed", client=client, name=name, error=f"{type(e).__name__}: {e}"[:300])
                self.counts["failed"] += 1
                return True  # the transport that took the socket closed it
            self.counts["terminated"] += 1
            return True
        await self._relay(conn, client, name, (route.host, route.port), fallback=route.fallback)
        return False

    def _refused(self, client: str, name: str | None, reason: str, *, send: bytes = b"",
                 conn: socket.socket | None = None, outcome: str = "refused") -> bool:
        # Logged and counted before the alert leaves: a client that sees its
        # refusal and then reads the log or /metrics finds it there. Written
        # after, a node descheduled between the send and the log line (a
        # loaded machine) showed the client a refusal the node had not yet told.
        log.info("tls_refused", client=client, name=name, reason=reason)
        self.counts[outcome] += 1
        if conn is not None:
            try:
                if send:
                    conn.send(send)  # one small record into an empty send buffer: never blocks
                # Read what was only peeked: a socket closed with unread bytes resets the
                # connection, and the client would lose the alert, or see a reset for a close.
                conn.recv(MAX_HELLO + 5)
            except OSError:
                pass
        return False

    async def _relay(self, conn: socket.socket, client: str, name: str, target: tuple[str, int], *,
                     fallback: tuple[str, int] | None = None) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout):
                upstream = await _connect(*target)
        except (OSError, TimeoutError) as e:
            if fallback is None:
                log.warning("tls_relay_failed", client=client, name=name, target=f"{target[0]}:{target[1]}",
                            error=f"{type(e).__name__}: {e}"[:300])
                self.counts["failed"] += 1
                return
            reason = ParentFallback.TIMEOUT if isinstance(e, TimeoutError) else ParentFallback.UNREACHABLE
            log.warning("parent_fallback", reason=reason.value, parent=f"{target[0]}:{target[1]}", host=name, tls=True,
                        error=f"{type(e).__name__}: {e}"[:300])
            if self.on_fallback is not None:
                self.on_fallback(reason.value)
            await self._relay(conn, client, name, fallback)
            return
        # The ClientHello is still queued in `conn` (peeked, not read): it goes first.
        started = time.monotonic()
        try:
            if self.splice:
                sent = await splice_both(conn, upstream)
            else:
                reader, writer = await asyncio.open_connection(sock=conn)
                up_reader, up_writer = await asyncio.open_connection(sock=upstream)
                try:
                    sent = await _pipe_both(reader, writer, up_reader, up_writer)
                finally:
                    up_writer.close()
                    writer.close()
        finally:
            upstream.close()
        self.counts["relayed"] += 1
        log.info("tls_relayed", client=client, name=name, target=f"{target[0]}:{target[1]}",
                 bytes_up=sent[0], bytes_down=sent[1], seconds=round(time.monotonic() - started, 3))


async def _connect(host: str, port: int) -> socket.socket:
    """A connected non-blocking socket to (host, port), trying each address the name has."""
    loop = asyncio.get_running_loop()
    error: OSError | None = None
    found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for family, type_, proto, _, address in found:
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error or OSError(f"{host} has no address")


async def _peek_hello(conn: socket.socket):
    """The ClientHello waiting in `conn`, left there; None if the client closed first.

    Raises NotClientHello for anything else (plain HTTP, a malformed hello).
    """
    seen = 0
    pauses = 0
    while True:
        await ready(conn.fileno())
        data = conn.recv(MAX_HELLO + 5, socket.MSG_PEEK)
        if not data:
            return None
        hello = read_client_hello(data)
        if hello is not None:
            return hello
        if len(data) == seen:  # nothing new yet: pause rather than spin on the queued bytes
            await asyncio.sleep(_PEEK_PAUSES[min(pauses, len(_PEEK_PAUSES) - 1)])
            pauses += 1
        else:
            pauses = 0
        seen = len(data)


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
