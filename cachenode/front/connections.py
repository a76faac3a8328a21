"""How many client connections a node holds, and which one gives way.

A node that runs out of descriptors stops accepting (asyncio backs off and
logs `socket.accept() out of system resource` once per attempt), so a few
hundred clients that trickle their request heads a byte at a time used to
lock every real client out. Three rules keep it answering:

- the soft open-files limit is raised to the hard one at start, since the
  default soft limit (often 1024, or 256) is an accident of the login shell;
- client connections are capped well below that limit, leaving descriptors
  for what every request needs besides its socket (object files, origin and
  peer connections, Redis);
- at the cap a new connection is still accepted: the connection that has
  waited longest for a complete request (an idle keep-alive one, or one
  still trickling its head) is closed to make room, and only when every
  connection is busy answering is the newcomer told 503 with Retry-After.

The choice is pure (`choose_reclaim`); `Gate` applies it to live connections.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Callable, Iterable, Protocol

import structlog

log = structlog.get_logger("nezha.connections")

# Descriptors kept for everything but client sockets, and how many each
# client connection may need at once (its socket and an open object file).
RESERVED_DESCRIPTORS = 64
PER_CONNECTION = 2
# Used when the hard limit is unlimited, which setrlimit cannot take as a soft value on Linux.
UNLIMITED_CAP = 1 << 20

# Bounds of a listener's backlog (and so of one accept burst).
MIN_BACKLOG = 16
MAX_BACKLOG = 1024

RETRY_AFTER_S = 1
_BUSY_BODY = b"this cache node is at its connection limit; retry shortly\n"
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Type: text/plain\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s") % (RETRY_AFTER_S, len(_BUSY_BODY), _BUSY_BODY)


def head_timeout_response(seconds: float) -> bytes:
    """The 408 a client gets when its request head did not arrive in time (RFC 9110 §15.5.9)."""
    body = f"no complete request head within {seconds:g} s\n".encode()
    return (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s") % (len(body), body)


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("open_files_limit_kept", soft=soft, hard=hard, error=str(e))
    return UNLIMITED_CAP if soft == resource.RLIM_INFINITY else soft


def listen_backlog(open_files: int) -> int:
    """The listen backlog for a node's sockets, sized to its descriptors.

    asyncio accepts up to `backlog` pending connections in one go, before any
    of them reaches the gate, so a listener's backlog is a burst of
    descriptors the gate cannot see: with a 1024 backlog, 300 clients
    connecting at once exhausted a 256-descriptor node (a CI failure) however
    low the cap. An eighth of the descriptors keeps that burst bounded.
    """
    return max(MIN_BACKLOG, min(MAX_BACKLOG, open_files // 8))


def default_max_connections(open_files: int, *, listeners: int = 2) -> int:
    """Client connections that fit in `open_files` descriptors with room for the rest.

    The rest is a fixed reserve plus one accept burst per listener (the plain
    port and the TLS port), see `listen_backlog`.
    """
    spare = open_files - RESERVED_DESCRIPTORS - listeners * listen_backlog(open_files)
    return max(8, spare // PER_CONNECTION)


def serve_handed(sock, protocol: Callable[[], asyncio.Protocol], tasks: set, *, lost: str, **fields) -> None:
    """Serve `sock`, a client connection another worker of the node accepted
    and passed here, with `protocol` as if accepted here: attached by a task
    kept in `tasks` meanwhile. A connection gone before it is attached is
    closed and logged as `lost` (with `fields`)."""
    loop = asyncio.get_running_loop()

    async def attach() -> None:
        try:
            await loop.connect_accepted_socket(protocol, sock)
        except OSError as e:
            sock.close()
            log.info(lost, error=str(e), **fields)

    task = loop.create_task(attach())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def node_gate(max_connections: int | None, open_files: int, *, metrics=None) -> "Gate":
    """A node process's connection gate: `max_connections` (the setting), or
    what its descriptors leave room for. Each worker of a node has its own."""
    limit = default_max_connections(open_files) if max_connections is None else max_connections
    return Gate(limit, metrics=metrics)


class Reclaimable(Protocol):
    """What the gate needs of a connection."""

    @property
    def waiting(self) -> bool:
        """True while the connection only waits for (the rest of) a request head."""

    @property
    def waiting_since(self) -> float:
        """Monotonic time that wait began: the end of its last answer, or its first byte."""

    def reclaim(self) -> None:
        """Close it to make room for another client."""


def choose_reclaim(connections: Iterable[Reclaimable]) -> Reclaimable | None:
    """The connection that has waited longest for a request, None if all are busy answering."""
    return min((c for c in connections if c.waiting), key=lambda c: c.waiting_since, default=None)


class Gate:
    """The node's client connections, at most `limit` of them."""

    def __init__(self, limit: int, *, metrics=None) -> None:
        self.limit = limit
        self.open: set[Reclaimable] = set()
        self.reclaimed = 0
        self.refused = 0
        self._metrics = metrics  # cachenode.metrics.Metrics, when a node's

    def admit(self, conn: Reclaimable) -> bool:
        """Count a new connection in; False if it must be answered 503 instead."""
        if len(self.open) >= self.limit:
            victim = choose_reclaim(self.open)
            if victim is None:
                self.refused += 1
                if self._metrics is not None:
                    self._metrics.connections_refused.inc()
                log.warning("connection_refused", open=len(self.open), limit=self.limit,
                            reason="every connection is answering a request")
                return False
            self.open.discard(victim)
            self.reclaimed += 1
            if self._metrics is not None:
                self._metrics.connections_reclaimed.inc()
            log.info("connection_reclaimed", open=len(self.open), limit=self.limit)
            victim.reclaim()
        self.open.add(conn)
        return True

    def enter(self, conn: Reclaimable) -> None:
        """A connection admitted already, now served by another protocol object."""
        self.open.add(conn)

    def leave(self, conn: Reclaimable) -> None:
        self.open.discard(conn)


class HeadTimer:
    """One connection's deadline for a complete request head: armed when a
    head begins (or the connection opens), disarmed when one completes;
    `expired` runs if it fires first."""

    def __init__(self, seconds: float, expired: Callable[[], None]) -> None:
        self.seconds = seconds
        self._expired = expired
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.seconds, self._fire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._expired()
