"""`Index`: the one handle a process opens on the shared index (nezha/index/__init__.py has the map)."""


from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from nezha.errors import ConfigError
from nezha.index.connection import Connection
from nezha.index.membership import MembershipWatch, MembershipWriter
from nezha.index.pins import PinRecords
from nezha.index.stats_reader import StatsReader
from nezha.index.stats_writer import StatsWriter
from nezha.ring import Membership


class Index:
    """One process's handle on the index. See the package docstring."""

    def __init__(self, *, redis_url: str | None, node_id: str | None, flush_interval: float = 1.0,
                 refresh_interval: float = 5.0, max_buffered: int = 10000, client: Any = None,
                 backoff_max: float = 5.0, clock: Callable[[], float] = time.time,
                 report: Callable[[], dict[str, Any]] | None = None, flush_batch: int = 1000) -> None:
        if flush_interval <= 0 or refresh_interval <= 0:
            raise ConfigError(f"flush_interval ({flush_interval}) and refresh_interval ({refresh_interval}) "
                              "must be positive")
        if max_buffered < 1 or flush_batch < 1:
            raise ConfigError(f"max_buffered ({max_buffered}) and flush_batch ({flush_batch}) must be at least 1")
        backoff_max = max(backoff_max, 0.05)
        self.node_id = node_id
        self.conn = Connection(redis_url=redis_url, client=client)
        self.watch = MembershipWatch(self.conn, refresh_interval=refresh_interval, backoff_max=backoff_max)
        self.writer = MembershipWriter(self.watch)
        self.stats = StatsWriter(self.conn, node_id=node_id, flush_interval=flush_interval,
                                 max_buffered=max_buffered, backoff_max=backoff_max, clock=clock, report=report,
                                 flush_batch=flush_batch)
        self.reader = StatsReader(self.conn)
        self.pins = PinRecords(self.conn, clock=clock)
        self._tasks: list[asyncio.Task] = []
        # Each call goes to the part that does that job (bound methods, not wrappers).
        self.count, self.object_stored = self.stats.count, self.stats.object_stored
        self.object_removed, self.object_accessed = self.stats.object_removed, self.stats.object_accessed
        self.flush, self.record_drain = self.stats.flush, self.stats.record_drain
        self.on_membership, self.get_membership = self.watch.on_membership, self.watch.get_membership
        self.claim_fence, self.set_membership = self.writer.claim_fence, self.writer.set_membership
        self.clear_membership = self.writer.clear_membership
        self.locations, self.object_info = self.reader.locations, self.reader.object_info
        self.read_stats, self.read_cluster_stats = self.reader.read_stats, self.reader.read_cluster_stats
        self.read_node_counters, self.read_drain = self.reader.read_node_counters, self.reader.read_drain
        self.record_pins, self.read_pins = self.pins.record_pins, self.pins.read_pins

    @property
    def enabled(self) -> bool:
        return self.conn.enabled

    @property
    def membership(self) -> Membership | None:
        """The membership this process knows (None before the first read)."""
        return self.watch.membership

    @property
    def buffered(self) -> int:
        return self.stats.buffered

    def status(self) -> dict:
        """Health of the index for /readyz detail; never touches Redis."""
        held = self.watch.membership
        return {
            "redis": self.conn.state,
            "reason": self.conn.reason,
            "buffered": self.stats.buffered,
            "dropped": self.stats.dropped,
            "epoch": held.epoch if held else None,
        }

    async def start(self, *, first_read_timeout: float = 1.0) -> None:
        """Read the membership once (up to `first_read_timeout`) and start the background loops.

        Never raises because Redis is down: the loops keep trying with backoff.
        """
        if not self.enabled or self._tasks:
            return
        self.conn.closing = False
        await self.watch.first_read(first_read_timeout)
        self._tasks = [
            asyncio.create_task(self.stats.flush_loop(), name="index-flush"),
            asyncio.create_task(self.watch.watch_loop(), name="index-watch"),
            asyncio.create_task(self.watch.refresh_loop(), name="index-refresh"),
        ]

    async def close(self, *, flush_timeout: float = 2.0) -> None:
        """Stop the loops, try one last flush, and close the client if we made it."""
        self.conn.closing = True
        tasks, self._tasks = self._tasks, []
        while tasks:
            for task in tasks:
                task.cancel()
            _, pending = await asyncio.wait(tasks, timeout=0.5)
            tasks = list(pending)
        if self.enabled:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stats.flush(), timeout=flush_timeout)
            await self.conn.aclose()  # a Redis error there is suppressed by the connection
