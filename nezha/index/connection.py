"""One Redis client for every part of the index, and the one way of saying "no Redis".

A `Connection` made without a URL (or an injected client) is *disabled*: a
node alone, or `nezha up` without Redis. Every part of the index asks
`enabled` and behaves as a cluster of one (membership kept in memory, no
shared stats); nothing else stands for "no Redis". A Redis that is
configured but does not answer is the other case, and always the same one:
the data path buffers and retries, and a caller that must have an answer
gets `IndexUnavailable` naming the step and the server.

The connection also keeps the index's health for /readyz: each part
reports its trouble and recovery under its own name ("flush", "watch", ...),
and the index is "degraded" while any of them is failing.

A trouble report also drops the client's idle pooled connections. Those
made before Redis went away are dead once it returns, and redis-py 8.1
hands them out unchecked under RESP3 (its pool skips the stale-socket test
while maintenance notifications are "auto", redis/redis-py#4252); a peer
gone without a FIN or with a RST passes that test anyway. Each would fail
its first command after the outage, and the part that drew one (the
watch's new subscription, a flush) would report a second outage that never
was: `index_degraded` and `index_recovered` twice for one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, NoReturn

import redis.asyncio as aredis
import structlog
from redis.exceptions import RedisError

from nezha import redis_url
from nezha.errors import ConfigError, NezhaError

log = structlog.get_logger("nezha.index")

REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class IndexUnavailable(NezhaError):
    """Redis could not be reached or refused a command that had to succeed."""


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`, for logs and messages."""
    return redis_url.redact(url)


def check_redis_url(url: str) -> str:
    try:
        return redis_url.check(url)
    except redis_url.BadRedisURL as e:
        raise ConfigError(str(e)) from e


def open_client(url: str, **options: Any) -> Any:
    """A redis.asyncio client for any URL form of nezha/redis_url.py; Sentinel's master is followed."""
    if not url.startswith("redis+sentinel://"):
        return aredis.from_url(url, **options)
    from redis.asyncio.sentinel import Sentinel

    target = redis_url.parse_sentinel(url)
    timeouts = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs={**timeouts, "password": target.sentinel_password})
    return sentinel.master_for(target.service, db=target.db, username=target.username, password=target.password,
                               **options)


def text(value: Any) -> str:
    """A value read from Redis as str (clients may decode or not)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def number(value: Any) -> int | float:
    raw = text(value)
    try:
        return int(raw)
    except ValueError:
        return float(raw)


class Connection:
    """The client, where it points (password redacted) and the index's health."""

    def __init__(self, *, redis_url: str | None, client: Any = None) -> None:
        self.owns_client = client is None and redis_url is not None
        if client is not None:
            self.client = client
            self.where = "injected client"
        elif redis_url is not None:
            check_redis_url(redis_url)
            self.where = redact_url(redis_url)
            # Short timeouts: a dead Redis must cost the background tasks a
            # second, not a minute. Retries are ours (backoff), not redis-py's.
            self.client = open_client(redis_url, decode_responses=True, socket_connect_timeout=1.0,
                                      socket_timeout=2.0, health_check_interval=10, retry=None)
        else:
            self.client = None
            self.where = "disabled"
        self._problems: dict[str, str] = {"connect": "not connected yet"} if self.enabled else {}
        # What the node's buffered writes add to the health log lines (StatsWriter sets them):
        # updates waiting, updates dropped, and what to do once Redis answers again.
        self.backlog: Callable[[], int] = lambda: 0
        self.dropped: Callable[[], int] = lambda: 0
        self.on_healthy: list[Callable[[], None]] = []
        # Set by close(): redis-py can turn a cancellation that lands inside a read into a
        # ConnectionError, which the loops would retry; they stop on this flag too.
        self.closing = False

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def unavailable(self, step: str, error: BaseException) -> NoReturn:
        """Raise IndexUnavailable for `step` (what was being done), chained to `error`."""
        raise IndexUnavailable(f"{step} {self.where}: {type(error).__name__}: {error}") from error

    # -- health ---------------------------------------------------------------
    @property
    def state(self) -> str:
        if not self.enabled:
            return "disabled"
        return "degraded" if self._problems else "ok"

    @property
    def reason(self) -> str | None:
        return next(iter(self._problems.values()), None)

    async def trouble(self, where: str, error: BaseException) -> None:
        """`where` failed: the index is degraded, and no connection pooled now is used again."""
        first = not self._problems or set(self._problems) == {"connect"}
        self._problems.pop("connect", None)
        self._problems[where] = f"{where} via {self.where}: {type(error).__name__}: {error}"
        if first:
            log.warning("index_degraded", reason=self._problems[where], buffered=self.backlog())
        await self._drop_idle_connections()

    async def _drop_idle_connections(self) -> None:
        """Close the pool's idle connections (the module docstring says why); the
        next command on each connects anew. Connections in use are left to their
        users, whose commands fail on their own if Redis is gone."""
        pool = getattr(self.client, "connection_pool", None)
        if pool is None:
            return
        with contextlib.suppress(*REDIS_ERRORS):
            await pool.disconnect(inuse_connections=False)

    def ok(self, where: str) -> None:
        """`where` works again; the index is healthy once no part is failing."""
        if not self._problems:
            return
        was_connecting = set(self._problems) == {"connect"}
        self._problems.pop(where, None)
        self._problems.pop("connect", None)
        if self._problems:
            return
        if was_connecting:
            log.info("index_connected", redis=self.where)
        else:
            log.info("index_recovered", redis=self.where, dropped=self.dropped())
        for hook in self.on_healthy:
            hook()

    async def aclose(self) -> None:
        if self.owns_client:
            try:
                await self.client.aclose()
            except REDIS_ERRORS:
                pass
