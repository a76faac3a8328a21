"""A node's statistics and object locations, written to Redis behind the data path.

The data path never waits on Redis. `count()` and the `object_*()` calls are
sync and only touch memory; a background loop sends what they buffered about
every `flush_interval` in one MULTI/EXEC, so a batch lands whole or not at
all. If Redis is down the batch goes back into the buffer and is retried with
backoff.

A burst does not wait for the interval: once `flush_batch` object updates
are buffered (a thousand small fills in less than a second), the loop sends
them at once, so while Redis answers the buffer stays far below
`max_buffered` and a burst of small fills costs one round trip per
`flush_batch` objects, not one per object and no dropped update. The early
flush is only taken while Redis answers: in backoff the loop keeps its pace.

Counters and object updates are kept apart in the buffer:
- counters (`count()`) are summed per origin host and never dropped: their
  size is bounded by the number of origins, not by traffic;
- object updates (`object_stored/removed/accessed`) are bounded by
  `max_buffered`. Accesses are coalesced per key (the latest wins). Beyond
  the bound the oldest access is dropped first (it only ages an LRU hint),
  then the oldest store/removal. Drops are counted in `dropped` and logged
  once per outage as `index_updates_dropped`.
A batch that Redis refused is put back in front of newer updates. If the
connection dies after Redis ran EXEC but before its reply arrived, that
batch's counters are sent twice; that is the one case of double counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import deque
from collections.abc import Callable, Collection, Mapping
from typing import Any

import structlog
from redis.exceptions import WatchError

from nezha.cancels import stop_if_cancelled
from nezha.index.connection import REDIS_ERRORS, Connection
from nezha.index.schema import (DRAIN_TTL, FIELDS, KEY_CLUSTER_STATS, holders, key_drain, key_host_stats,
                                key_node_stats, key_object, node_field)

log = structlog.get_logger("nezha.index")


class StatsWriter:
    """One node's buffered writes: counters per origin host, object locations, last accesses."""

    def __init__(self, conn: Connection, *, node_id: str | None, flush_interval: float, max_buffered: int,
                 backoff_max: float, clock: Callable[[], float],
                 report: Callable[[], Mapping[str, Any]] | None = None, flush_batch: int = 1000) -> None:
        self.conn = conn
        # The node's own figures (not counters: values as they are now), written
        # into its stats hash at every flush beside `updated_at`.
        self._report = report
        self.node_id = node_id
        self._flush_interval = flush_interval
        self._max_buffered = max_buffered
        self._flush_batch = flush_batch
        self._due = asyncio.Event()  # set once `flush_batch` updates wait: the loop flushes before its interval
        self._backoff_max = backoff_max
        self._clock = clock
        self._counters: dict[str, dict[str, int]] = {}
        self._ops: deque[tuple] = deque()
        self._sending = 0  # updates of the batch on its way to Redis (`buffered`)
        self._accesses: dict[str, float] = {}
        self.dropped = 0
        self._dropped_logged = False
        self._flush_lock = asyncio.Lock()
        conn.backlog = lambda: self.buffered
        conn.dropped = lambda: self.dropped
        conn.on_healthy.append(self._healthy)

    def _healthy(self) -> None:
        self._dropped_logged = False  # the next outage's drops are logged again

    # -- the data path: sync, memory only ------------------------------------

    def count(self, host: str, **deltas: int) -> None:
        """Add signed `deltas` (names from FIELDS) to this node's, `host`'s and the cluster's stats.

        This is the only way counters change, `objects` and `bytes_stored`
        included (`objects=-1, bytes_stored=-size` on eviction): the
        `object_*` calls below maintain locations only.
        """
        for name, value in deltas.items():
            if name not in FIELDS:
                raise ValueError(f"unknown stats field {name!r}; known fields: {', '.join(FIELDS)}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"stats field {name!r} takes an int delta, got {value!r}")
        if not self.conn.enabled:
            return
        pending = self._counters.setdefault(host.lower(), {})
        for name, value in deltas.items():
            if value:
                pending[name] = pending.get(name, 0) + value

    def object_stored(self, key: str, *, host: str, size: int) -> None:
        """This node now holds `key` (of `host`, `size` bytes)."""
        if self.conn.enabled and self.node_id:
            self._ops.append(("stored", key, host.lower(), int(size), self._clock()))
            self._trim()

    def object_removed(self, key: str, *, host: str, size: int) -> None:
        """This node no longer holds `key`. `host` and `size` mirror object_stored;
        counters are not touched (see count())."""
        if self.conn.enabled and self.node_id:
            self._ops.append(("removed", key))
            self._trim()

    def object_accessed(self, key: str) -> None:
        """`key` was just read; updates its last access if some node holds it."""
        if self.conn.enabled and self.node_id:
            self._accesses.pop(key, None)
            self._accesses[key] = self._clock()
            self._trim()

    def _trim(self) -> None:
        if len(self._ops) + len(self._accesses) >= self._flush_batch:
            self._due.set()
        while len(self._ops) + len(self._accesses) > self._max_buffered:
            if self._accesses:
                del self._accesses[next(iter(self._accesses))]
            else:
                self._ops.popleft()
            self.dropped += 1
            if not self._dropped_logged:
                self._dropped_logged = True
                log.warning("index_updates_dropped", max_buffered=self._max_buffered,
                            reason=self.conn.reason)

    @property
    def buffered(self) -> int:
        """Pending object updates plus origin hosts with pending counters, those of a batch being sent
        included: a reader told 0 finds in Redis everything counted so far."""
        return _updates(self._counters, self._ops, self._accesses) + self._sending

    # -- flushing ---------------------------------------------------------------

    async def flush(self) -> bool:
        """Send everything buffered in one MULTI/EXEC; True if Redis took it.

        On failure the batch goes back into the buffer and the index is
        marked degraded; this never raises for a Redis problem.
        """
        if not self.conn.enabled:
            return True
        async with self._flush_lock:
            counters, ops, accesses = self._counters, list(self._ops), self._accesses
            self._counters, self._ops, self._accesses = {}, deque(), {}
            self._sending = _updates(counters, ops, accesses)
            try:
                removed = await self._send(counters, ops, accesses)
            except REDIS_ERRORS as e:
                self._restore(counters, ops, accesses)
                await self.conn.trouble("flush", e)
                return False
            except asyncio.CancelledError:
                self._restore(counters, ops, accesses)  # close() sends them in its last flush
                raise
            finally:
                self._sending = 0
            self.conn.ok("flush")
            self.conn.ok("refresh")  # Redis answers again; the next re-read would only confirm it
            await self._forget_unheld(removed)
            return True

    async def _send(self, counters: dict[str, dict[str, int]], ops: list[tuple],
                    accesses: dict[str, float]) -> list[str]:
        node = self.node_id
        held = await self._held(accesses)
        pipe = self.conn.client.pipeline(transaction=True)
        removed: list[str] = []
        for op in ops:
            if op[0] == "stored":
                _, key, _host, size, at = op
                # Whole seconds: Redis keeps an integer in a few bytes, a decimal as text. No host and no
                # URL: the key names both (nezha/keys.py), each field costs every object its bytes, and a
                # value over 64 bytes (Redis's hash-max-listpack-value; most dataset URLs are longer)
                # turns the whole hash from a listpack into a table of more than twice its bytes.
                pipe.hset(key_object(key), mapping={"size": size, "stored_at": int(at),
                                                    "last_access": int(at), node_field(node): "1"})
            else:
                pipe.hdel(key_object(op[1]), node_field(node))
                removed.append(op[1])
        for key, at in accesses.items():
            if key in held:  # an access never creates the record of an object that no node holds
                pipe.hset(key_object(key), "last_access", int(at))
        totals: dict[str, int] = {}
        for host, fields in counters.items():
            for name, value in fields.items():
                pipe.hincrby(key_host_stats(host), name, value)
                totals[name] = totals.get(name, 0) + value
        for name, value in totals.items():
            if node:
                pipe.hincrby(key_node_stats(node), name, value)
            pipe.hincrby(KEY_CLUSTER_STATS, name, value)
        if node:
            # Written on every flush, so an operator sees when a node last reported.
            pipe.hset(key_node_stats(node), mapping={"updated_at": f"{self._clock():.3f}",
                                                     **(self._report() if self._report else {})})
        if len(pipe):
            await pipe.execute()
        return removed

    async def _held(self, keys: Mapping[str, float]) -> set[str]:
        """Of `keys`, those whose record exists: one pipelined round trip for a
        whole batch of accesses. A record deleted between this read and the
        write that follows would get back a hash naming no holder, which every
        reader takes for no object (docs/redis-schema.md)."""
        if not keys:
            return set()
        pipe = self.conn.client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key_object(key))
        return {key for key, there in zip(keys, await pipe.execute()) if there}

    async def _forget_unheld(self, removed: list[str]) -> None:
        """Delete the record of objects that no node holds any more.

        One pipelined read finds which of a batch's removed objects name no
        holder; each of those is deleted under WATCH, so a node storing the
        key at the same moment aborts our EXEC and the record stays.
        """
        keys = list(dict.fromkeys(removed))
        if not keys:
            return
        try:
            pipe = self.conn.client.pipeline(transaction=False)
            for key in keys:
                pipe.hkeys(key_object(key))
            unheld = [key for key, fields in zip(keys, await pipe.execute()) if fields and not holders(fields)]
        except REDIS_ERRORS as e:
            log.info("object_metadata_left", key=keys[0], objects=len(keys), error=str(e))
            return
        for key in unheld:
            try:
                async with self.conn.client.pipeline(transaction=True) as pipe:
                    await pipe.watch(key_object(key))
                    if holders(await pipe.hkeys(key_object(key))):
                        continue
                    pipe.multi()
                    pipe.delete(key_object(key))
                    await pipe.execute()
            except WatchError:
                continue
            except REDIS_ERRORS as e:
                # Harmless leftover: a record that names no holder is no object to any reader.
                log.info("object_metadata_left", key=key, error=str(e))
                return

    def _restore(self, counters: dict[str, dict[str, int]], ops: list[tuple], accesses: dict[str, float]) -> None:
        for host, fields in counters.items():
            pending = self._counters.setdefault(host, {})
            for name, value in fields.items():
                pending[name] = pending.get(name, 0) + value
        self._ops.extendleft(reversed(ops))
        merged = dict(accesses)
        for key, at in self._accesses.items():
            merged.pop(key, None)
            merged[key] = at
        self._accesses = merged
        self._trim()

    async def flush_loop(self) -> None:
        delay = self._flush_interval
        failing = False
        while not self.conn.closing:
            stop_if_cancelled()  # the last flush may have swallowed it (nezha/cancels.py)
            if failing:  # backing off: a burst does not hurry a Redis that fails
                await asyncio.sleep(delay * random.uniform(0.8, 1.0))
            else:
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a
                # cancellation that lands as the event is set (nezha/cancels.py).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay * random.uniform(0.8, 1.0)):
                        await self._due.wait()
            self._due.clear()
            failing = not await self.flush()
            if not failing:
                delay = self._flush_interval
            else:
                delay = min(min(delay, self._backoff_max) * 2, self._backoff_max)

    # -- a node's last word --------------------------------------------------

    async def record_drain(self, result: Mapping[str, Any]) -> None:
        """This node's hand-off result, for the controller's Events (`nezha:drain:<id>`); best effort."""
        if not self.conn.enabled or self.node_id is None:
            return
        fields = {k: (v if isinstance(v, (int, float, str)) else json.dumps(v)) for k, v in result.items()}
        pipe = self.conn.client.pipeline(transaction=True)
        pipe.delete(key_drain(self.node_id))
        pipe.hset(key_drain(self.node_id), mapping=fields)
        pipe.expire(key_drain(self.node_id), DRAIN_TTL)
        try:
            await asyncio.wait_for(pipe.execute(), timeout=2.0)
        except REDIS_ERRORS as e:
            log.warning("drain_not_recorded", error=f"{type(e).__name__}: {e}")


def _updates(counters: Mapping[str, Mapping[str, int]], ops: Collection[tuple],
             accesses: Mapping[str, float]) -> int:
    """Object updates, plus origin hosts with counters to send: what `buffered` counts."""
    return len(ops) + len(accesses) + sum(1 for c in counters.values() if c)
