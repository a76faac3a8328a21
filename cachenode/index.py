"""The shared index in Redis: ring membership, object locations, statistics.

This is the only module of a cache node that talks to Redis; the key schema
it writes is a public interface, documented in docs/redis-schema.md, and the
`KEY_*`/`key_*` names below are its one copy in code.

The data path never waits on Redis. `count()` and the `object_*()` calls are
sync and only touch memory; a background task sends what they buffered about
every `flush_interval` in one MULTI/EXEC, so a batch lands whole or not at
all. If Redis is down the batch goes back into the buffer and is retried with
backoff; counters are aggregated per origin host, so an outage of any length
costs a few dict entries, while object updates are bounded by `max_buffered`.

Membership is learned two ways, so a node misses no change: a pub/sub message
on `nezha:ring:changed` (the fast path, milliseconds) and a periodic re-read
every `refresh_interval` (the fallback when a message was lost, e.g. while the
subscription was reconnecting). Reads are serialised, and each one adopts
whatever Redis holds if it differs from the last known membership; with
Redis gone the node keeps the last membership it had.

    Index(redis_url=None)    disabled: no Redis; membership is set locally
    Index(redis_url=...)     "ok" while Redis answers, "degraded" with the
                             reason while it does not, never raising to the
                             data path
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aredis
import structlog
from redis.exceptions import RedisError, WatchError

from nezha import redis_url
from nezha.ring import Membership
from nezha.config import parse_hostport
from nezha.errors import ConfigError, NezhaError

log = structlog.get_logger("nezha.index")

PREFIX = "nezha:"
KEY_EPOCH = "nezha:ring:epoch"  # string: int, INCR on every membership write
KEY_NODES = "nezha:ring:nodes"  # hash: node id -> "host:port"
KEY_WEIGHTS = "nezha:ring:weights"  # hash: node id -> weight
KEY_REPLICAS = "nezha:ring:replicas"  # string: int, owners per key for every node (absent: each node's own)
KEY_LEAVING = "nezha:ring:leaving"  # set: node ids a scale-down took out of the ring; they hand off on SIGTERM
KEY_FENCE = "nezha:ring:leader"  # hash: generation (the Lease's leaseTransitions), holder: who may write the ring
CHANNEL_RING = "nezha:ring:changed"  # pub/sub: message is the new epoch
KEY_OBJECTS = "nezha:objects"  # zset: cache key -> last access (unix seconds)
KEY_CLUSTER_STATS = "nezha:stats:cluster"  # hash: FIELDS

FIELDS = ("hits", "misses", "peer_hits", "bytes_from_origin", "bytes_served",
          "objects", "bytes_stored", "evictions", "failed_fills")


def hit_ratio(stats: Mapping) -> float | None:
    """(hits + peer_hits) / (hits + peer_hits + misses) of a stats hash; None before any request."""
    served = stats.get("hits", 0) + stats.get("peer_hits", 0)
    total = served + stats.get("misses", 0)
    return served / total if total else None


def key_drain(node_id: str) -> str:
    """hash: how a node's last hand-off on leaving the ring ended (kept a day)."""
    return f"{PREFIX}drain:{node_id}"


DRAIN_TTL = 86400


def key_node_stats(node_id: str) -> str:
    return f"nezha:stats:node:{node_id}"


def key_host_stats(host: str) -> str:
    return f"nezha:stats:host:{host}"


def key_object(key: str) -> str:
    """Hash of one object's metadata: url, host, size, stored_at."""
    return f"nezha:obj:{key}"


def key_locations(key: str) -> str:
    """Set of node ids holding the object. A different prefix from key_object,
    so no cache key (which may contain ":") can name another object's key."""
    return f"nezha:loc:{key}"


UNCHANGED = object()  # set_membership(replicas=UNCHANGED): leave nezha:ring:replicas as it is


class Deposed(NezhaError):
    """A ring write or claim by a controller that no longer leads: refused by the fence."""


@dataclass(frozen=True)
class Fence:
    """The leader's right to write the ring: its Lease generation and identity."""

    generation: int
    holder: str


class IndexUnavailable(NezhaError):
    """Redis could not be reached or refused a command that had to succeed."""


_REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


def check_membership(nodes: Mapping[str, str], weights: Mapping[str, int] | None = None
                     ) -> tuple[dict[str, str], dict[str, int]]:
    """Validated copies of `nodes` and `weights` (completed with weight 1), or ConfigError naming the entry."""
    clean_nodes: dict[str, str] = {}
    for node, address in nodes.items():
        if not isinstance(node, str) or not node or any(c.isspace() for c in node):
            raise ConfigError(f"ring node id {node!r} must be a non-empty string without spaces")
        try:
            parse_hostport(str(address), field=f"address of ring node {node!r}")
        except ValueError as e:
            raise ConfigError(str(e)) from e
        clean_nodes[node] = str(address)
    clean_weights = {n: 1 for n in clean_nodes}
    for node, weight in (weights or {}).items():
        if node not in clean_nodes:
            raise ConfigError(f"weight given for {node!r}, which is not among the ring nodes {sorted(clean_nodes)}")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise ConfigError(f"weight of ring node {node!r} must be a positive int, got {weight!r}")
        clean_weights[node] = weight
    return clean_nodes, clean_weights


def _fence_of(raw: Mapping) -> Fence | None:
    values = {_s(k): _s(v) for k, v in (raw or {}).items()}
    try:
        return Fence(generation=int(values["generation"]), holder=values["holder"])
    except (KeyError, ValueError):
        return None


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`, for logs and messages."""
    return redis_url.redact(url)


def check_redis_url(url: str) -> str:
    try:
        return redis_url.check(url)
    except redis_url.BadRedisURL as e:
        raise ConfigError(str(e)) from e


def open_client(url: str, **options: Any) -> Any:
    """A redis.asyncio client for any URL form of cachenode/redis_url.py; Sentinel's master is followed."""
    if not url.startswith("redis+sentinel://"):
        return aredis.from_url(url, **options)
    from redis.asyncio.sentinel import Sentinel

    target = redis_url.parse_sentinel(url)
    timeouts = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs={**timeouts, "password": target.sentinel_password})
    return sentinel.master_for(target.service, db=target.db, username=target.username, password=target.password,
                               **options)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _num(value: Any) -> int | float:
    text = _s(value)
    try:
        return int(text)
    except ValueError:
        return float(text)


class Index:
    """One node's connection to the shared index. See the module docstring.

    Counters and object updates are kept apart in the buffer:
    - counters (`count()`) are summed per origin host and never dropped: their
      size is bounded by the number of origins, not by traffic;
    - object updates (`object_stored/removed/accessed`) are bounded by
      `max_buffered`. Accesses are coalesced per key (the latest wins). Beyond
      the bound the oldest access is dropped first (it only ages an LRU hint),
      then the oldest store/removal. Drops are counted in `status()["dropped"]`
      and logged once per outage as `index_updates_dropped`.
    A batch that Redis refused is put back in front of newer updates. If the
    connection dies after Redis ran EXEC but before its reply arrived, that
    batch's counters are sent twice; that is the one case of double counting.
    """

    def __init__(self, *, redis_url: str | None, node_id: str | None, flush_interval: float = 1.0,
                 refresh_interval: float = 5.0, max_buffered: int = 10000, client: Any = None,
                 backoff_max: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        if flush_interval <= 0 or refresh_interval <= 0:
            raise ConfigError(f"flush_interval ({flush_interval}) and refresh_interval ({refresh_interval}) "
                              "must be positive")
        if max_buffered < 1:
            raise ConfigError(f"max_buffered ({max_buffered}) must be at least 1")
        self.node_id = node_id
        self.membership: Membership | None = None
        self._flush_interval = flush_interval
        self._refresh_interval = refresh_interval
        self._max_buffered = max_buffered
        self._backoff_max = max(backoff_max, 0.05)
        self._clock = clock
        self._owns_client = client is None and redis_url is not None
        if client is not None:
            self._client = client
            self._where = "injected client"
        elif redis_url is not None:
            check_redis_url(redis_url)
            self._where = redact_url(redis_url)
            # Short timeouts: a dead Redis must cost the background tasks a
            # second, not a minute. Retries are ours (backoff), not redis-py's.
            self._client = open_client(redis_url, decode_responses=True, socket_connect_timeout=1.0,
                                       socket_timeout=2.0, health_check_interval=10, retry=None)
        else:
            self._client = None
            self._where = "disabled"
        self._callbacks: list[Callable[[Membership], None]] = []
        self._counters: dict[str, dict[str, int]] = {}
        self._ops: deque[tuple] = deque()
        self._accesses: dict[str, float] = {}
        self._dropped = 0
        self._dropped_logged = False
        self._problems: dict[str, str] = {"connect": "not connected yet"} if self.enabled else {}
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._read_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return self._client is not None

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
        if not self.enabled:
            return
        pending = self._counters.setdefault(host.lower(), {})
        for name, value in deltas.items():
            if value:
                pending[name] = pending.get(name, 0) + value

    def object_stored(self, key: str, *, url: str, host: str, size: int) -> None:
        """This node now holds `key` (fetched from `url` of `host`, `size` bytes)."""
        if self.enabled and self.node_id:
            self._ops.append(("stored", key, url, host.lower(), int(size), self._clock()))
            self._trim()

    def object_removed(self, key: str, *, host: str, size: int) -> None:
        """This node no longer holds `key`. `host` and `size` mirror object_stored;
        counters are not touched (see count())."""
        if self.enabled and self.node_id:
            self._ops.append(("removed", key))
            self._trim()

    def object_accessed(self, key: str) -> None:
        """`key` was just read; updates its last access if some node holds it."""
        if self.enabled and self.node_id:
            self._accesses.pop(key, None)
            self._accesses[key] = self._clock()
            self._trim()

    def _trim(self) -> None:
        while len(self._ops) + len(self._accesses) > self._max_buffered:
            if self._accesses:
                del self._accesses[next(iter(self._accesses))]
            else:
                self._ops.popleft()
            self._dropped += 1
            if not self._dropped_logged:
                self._dropped_logged = True
                log.warning("index_updates_dropped", max_buffered=self._max_buffered,
                            reason=self._reason())

    @property
    def buffered(self) -> int:
        """Pending object updates plus origin hosts with pending counters."""
        return len(self._ops) + len(self._accesses) + sum(1 for c in self._counters.values() if c)

    def status(self) -> dict:
        """Health of the index for /readyz detail; never touches Redis."""
        if not self.enabled:
            state = "disabled"
        else:
            state = "degraded" if self._problems else "ok"
        return {
            "redis": state,
            "reason": self._reason(),
            "buffered": self.buffered,
            "dropped": self._dropped,
            "epoch": self.membership.epoch if self.membership else None,
        }

    def _reason(self) -> str | None:
        return next(iter(self._problems.values()), None)

    def _trouble(self, where: str, error: BaseException) -> None:
        first = not self._problems or set(self._problems) == {"connect"}
        self._problems.pop("connect", None)
        self._problems[where] = f"{where} via {self._where}: {type(error).__name__}: {error}"
        if first:
            log.warning("index_degraded", reason=self._problems[where], buffered=self.buffered)

    def _ok(self, where: str) -> None:
        if not self._problems:
            return
        was_connecting = set(self._problems) == {"connect"}
        self._problems.pop(where, None)
        self._problems.pop("connect", None)
        if not self._problems:
            if was_connecting:
                log.info("index_connected", redis=self._where)
            else:
                log.info("index_recovered", redis=self._where, dropped=self._dropped)
            self._dropped_logged = False

    # -- membership -----------------------------------------------------------

    def on_membership(self, callback: Callable[[Membership], None]) -> None:
        """Call `callback(membership)` (sync, from the event loop) whenever the known membership changes.

        Called at once if a membership is already known.
        """
        self._callbacks.append(callback)
        if self.membership is not None:
            self._notify(callback, self.membership)

    def _notify(self, callback: Callable[[Membership], None], membership: Membership) -> None:
        try:
            callback(membership)
        except Exception:
            log.exception("membership_callback_failed", epoch=membership.epoch)

    def _adopt(self, membership: Membership) -> None:
        if membership == self.membership:
            return
        self.membership = membership
        log.info("membership_changed", epoch=membership.epoch, nodes=sorted(membership.nodes))
        for callback in list(self._callbacks):
            self._notify(callback, membership)

    async def _read_membership(self) -> Membership | None:
        pipe = self._client.pipeline(transaction=True)
        pipe.get(KEY_EPOCH)
        pipe.hgetall(KEY_NODES)
        pipe.hgetall(KEY_WEIGHTS)
        pipe.get(KEY_REPLICAS)
        pipe.smembers(KEY_LEAVING)
        epoch, nodes, weights, raw_replicas, leaving = await pipe.execute()
        if epoch is None:
            return None
        replicas = None
        if raw_replicas is not None:
            try:
                replicas = int(_s(raw_replicas))
            except ValueError:
                replicas = 0
            if replicas < 1:
                log.warning("ring_replicas_invalid", key=KEY_REPLICAS, value=_s(raw_replicas))
                replicas = None
        nodes = {_s(k): _s(v) for k, v in nodes.items()}
        raw_weights = {_s(k): _s(v) for k, v in weights.items()}
        clean: dict[str, int] = {}
        for node in nodes:
            try:
                clean[node] = max(int(raw_weights.get(node, "1")), 1)
            except ValueError:
                log.warning("ring_weight_invalid", node=node, weight=raw_weights[node])
                clean[node] = 1
        return Membership(epoch=int(_s(epoch)), nodes=nodes, weights=clean, replicas=replicas,
                          leaving=frozenset(_s(n) for n in leaving or ()))

    async def _refresh_membership(self) -> None:
        async with self._read_lock:
            membership = await self._read_membership()
            if membership is not None:
                self._adopt(membership)

    async def get_membership(self) -> Membership | None:
        """Membership as Redis holds it now (None if never written); the local one when disabled."""
        if not self.enabled:
            return self.membership
        try:
            return await self._read_membership()
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"read ring membership from {self._where}: {type(e).__name__}: {e}") from e

    async def claim_fence(self, fence: Fence) -> Fence | None:
        """Make `fence` the only one whose ring writes are taken.

        Taken when the stored generation is lower (a new leader), or equal
        with the same holder (a renewal). Returns None when taken, else the
        stored fence that is newer: the caller is deposed, or (a Lease made
        anew, whose count restarted) must raise its generation above it.
        """
        async with self._client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(KEY_FENCE)
                stored = _fence_of(await pipe.hgetall(KEY_FENCE))
                if stored is not None and (stored.generation > fence.generation or (
                        stored.generation == fence.generation and stored.holder != fence.holder)):
                    await pipe.unwatch()
                    return stored
                pipe.multi()
                pipe.hset(KEY_FENCE, mapping={"generation": str(fence.generation), "holder": fence.holder})
                await pipe.execute()
            except WatchError:
                return _fence_of(await self._client.hgetall(KEY_FENCE)) or fence
            except _REDIS_ERRORS as e:
                raise IndexUnavailable(f"claim the ring fence in {self._where}: {type(e).__name__}: {e}") from e
        log.info("ring_fence_claimed", generation=fence.generation, holder=fence.holder)
        return None

    async def set_membership(self, nodes: dict[str, str], weights: dict[str, int] | None = None, *,
                             replicas: int | None | object = UNCHANGED, fence: Fence | None = None,
                             leaving: frozenset[str] | set[str] | object = UNCHANGED) -> int:
        """Replace the membership, bump the epoch atomically, tell every node; returns the new epoch.

        `leaving` (the nodes a scale-down took out, which hand their objects
        off on SIGTERM; a node merely out of the ring is restarting) and
        `replicas` (owners per key for every node; None removes it) are
        written in the same MULTI, so no node sees a ring with the other's
        owner count; left out, it stays as it is.
        With `fence` (the controller), the write is taken only while Redis
        holds exactly that fence, checked in the same transaction (WATCH):
        a controller that lost its Lease cannot write, even late. Raises
        Deposed then, ConfigError for a bad entry and IndexUnavailable if
        Redis did not take it.
        """
        nodes, weights = check_membership(nodes, weights)
        if replicas is not UNCHANGED and replicas is not None and (
                isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1):
            raise ConfigError(f"replicas per key must be a positive int, got {replicas!r}")
        if not self.enabled:
            async with self._read_lock:
                epoch = (self.membership.epoch if self.membership else 0) + 1
                kept = self.membership.replicas if self.membership else None
                gone = self.membership.leaving if self.membership else frozenset()
                self._adopt(Membership(epoch=epoch, nodes=nodes, weights=weights,
                                       replicas=kept if replicas is UNCHANGED else replicas,
                                       leaving=gone if leaving is UNCHANGED else frozenset(leaving)))
            return epoch
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                if fence is not None:
                    await pipe.watch(KEY_FENCE)
                    stored = _fence_of(await pipe.hgetall(KEY_FENCE))
                    if stored != fence:
                        await pipe.unwatch()
                        raise Deposed(f"ring write refused: {self._where} holds the fence of "
                                      f"{stored.holder if stored else 'nobody'} (generation "
                                      f"{stored.generation if stored else '-'}), not {fence.holder} "
                                      f"(generation {fence.generation})")
                    pipe.multi()
                pipe.incr(KEY_EPOCH)
                pipe.delete(KEY_NODES, KEY_WEIGHTS)
                if nodes:
                    pipe.hset(KEY_NODES, mapping=nodes)
                    pipe.hset(KEY_WEIGHTS, mapping=weights)
                if replicas is None:
                    pipe.delete(KEY_REPLICAS)
                elif replicas is not UNCHANGED:
                    pipe.set(KEY_REPLICAS, str(replicas))
                if leaving is not UNCHANGED:
                    pipe.delete(KEY_LEAVING)
                    if leaving:
                        pipe.sadd(KEY_LEAVING, *sorted(leaving))
                epoch = int((await pipe.execute())[0])
        except WatchError as e:
            raise Deposed(f"ring write refused: the fence in {self._where} changed during the write") from e
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"write ring membership to {self._where}: {type(e).__name__}: {e}") from e
        try:
            await self._client.publish(CHANNEL_RING, str(epoch))
        except _REDIS_ERRORS as e:
            # Written but not announced: nodes still see it at their next re-read.
            log.warning("ring_publish_failed", epoch=epoch, error=str(e))
        async with self._read_lock:
            if self.membership is None or self.membership.epoch < epoch:
                kept = self.membership.replicas if self.membership else None
                gone = self.membership.leaving if self.membership else frozenset()
                self._adopt(Membership(epoch=epoch, nodes=nodes, weights=weights,
                                       replicas=kept if replicas is UNCHANGED else replicas,
                                       leaving=gone if leaving is UNCHANGED else frozenset(leaving)))
        log.info("ring_written", epoch=epoch, nodes=sorted(nodes))
        return epoch

    async def clear_membership(self, *, if_nodes: Mapping[str, str]) -> bool:
        """Remove the ring, if it is still `if_nodes` (nobody replaced it meanwhile); True if removed.

        For `nezha up` on exit: the ring named its nodes, which are gone. The
        epoch moves on, so a node that still listens sees the change.
        """
        if not self.enabled:
            return False
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                await pipe.watch(KEY_NODES)
                if await pipe.hgetall(KEY_NODES) != dict(if_nodes):
                    await pipe.unwatch()
                    return False
                pipe.multi()
                pipe.delete(KEY_NODES, KEY_WEIGHTS, KEY_REPLICAS, KEY_LEAVING)
                pipe.incr(KEY_EPOCH)
                await pipe.execute()
        except WatchError:
            return False
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"remove the ring from {self._where}: {type(e).__name__}: {e}") from e
        log.info("ring_removed", nodes=sorted(if_nodes))
        return True

    # -- reads for operators and peers ---------------------------------------

    async def locations(self, key: str) -> set[str]:
        """Node ids that hold `key` according to Redis (updates not yet flushed are not included)."""
        if not self.enabled:
            return set()
        try:
            return {_s(m) for m in await self._client.smembers(key_locations(key))}
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"read locations of {key} from {self._where}: {type(e).__name__}: {e}") from e

    async def object_info(self, key: str) -> dict | None:
        """{"url", "host", "size", "stored_at", "last_access", "nodes"} of `key`, or None if no node holds it."""
        if not self.enabled:
            return None
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.hgetall(key_object(key))
            pipe.zscore(KEY_OBJECTS, key)
            pipe.smembers(key_locations(key))
            meta, last_access, nodes = await pipe.execute()
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"read object {key} from {self._where}: {type(e).__name__}: {e}") from e
        if not nodes:
            return None
        meta = {_s(k): _s(v) for k, v in meta.items()}
        return {
            "url": meta.get("url"),
            "host": meta.get("host"),
            "size": int(meta["size"]) if "size" in meta else None,
            "stored_at": float(meta["stored_at"]) if "stored_at" in meta else None,
            "last_access": float(last_access) if last_access is not None else None,
            "nodes": {_s(n) for n in nodes},
        }

    async def read_cluster_stats(self) -> dict[str, int]:
        """`nezha:stats:cluster` alone (every FIELD an int, 0 if absent): one read, no scan."""
        try:
            raw = await self._client.hgetall(KEY_CLUSTER_STATS)
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"read stats from {self._where}: {type(e).__name__}: {e}") from e
        values = {_s(k): _num(v) for k, v in raw.items()}
        return {f: int(values.get(f, 0)) for f in FIELDS}

    async def record_drain(self, result: Mapping[str, Any]) -> None:
        """This node's hand-off result, for the controller's Events (`nezha:drain:<id>`); best effort."""
        if not self.enabled or self.node_id is None:
            return
        fields = {k: (v if isinstance(v, (int, float, str)) else json.dumps(v)) for k, v in result.items()}
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(key_drain(self.node_id))
        pipe.hset(key_drain(self.node_id), mapping=fields)
        pipe.expire(key_drain(self.node_id), DRAIN_TTL)
        try:
            await asyncio.wait_for(pipe.execute(), timeout=2.0)
        except (*_REDIS_ERRORS,) as e:
            log.warning("drain_not_recorded", error=f"{type(e).__name__}: {e}")

    async def read_drain(self, node_id: str) -> dict | None:
        """A node's last recorded hand-off (see `record_drain`), or None."""
        try:
            raw = await self._client.hgetall(key_drain(node_id))
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"read {key_drain(node_id)} from {self._where}: {type(e).__name__}: {e}") from e
        if not raw:
            return None
        out: dict[str, Any] = {}
        for k, v in raw.items():
            k, v = _s(k), _s(v)
            try:
                out[k] = json.loads(v) if k == "errors" else _num(v)
            except ValueError:
                out[k] = v
        return out

    async def read_node_counters(self, node_ids: list[str], field: str = "bytes_served") -> dict[str, int]:
        """One counter of `nezha:stats:node:<id>` for each of `node_ids` that has it (one round trip)."""
        if field not in FIELDS:
            raise ValueError(f"unknown stats field {field!r}")
        pipe = self._client.pipeline(transaction=False)
        for node in node_ids:
            pipe.hget(key_node_stats(node), field)
        try:
            values = await pipe.execute()
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"read stats from {self._where}: {type(e).__name__}: {e}") from e
        out = {}
        for node, value in zip(node_ids, values):
            if value is not None:
                try:
                    out[node] = int(_s(value))
                except ValueError:
                    continue
        return out

    async def read_stats(self) -> dict:
        """{"cluster": {...}, "nodes": {id: {...}}, "hosts": {host: {...}}}, every FIELD an int (0 if absent)."""
        if not self.enabled:
            raise IndexUnavailable("the index is disabled (no redis_url): there are no shared stats")
        try:
            names: list[str] = []
            for pattern in (key_node_stats("*"), key_host_stats("*")):
                async for name in self._client.scan_iter(match=pattern, count=500):
                    names.append(_s(name))
            names = sorted(set(names))
            pipe = self._client.pipeline(transaction=False)
            pipe.hgetall(KEY_CLUSTER_STATS)
            for name in names:
                pipe.hgetall(name)
            cluster, *hashes = await pipe.execute()
        except _REDIS_ERRORS as e:
            raise IndexUnavailable(f"read stats from {self._where}: {type(e).__name__}: {e}") from e

        def parse(raw: Mapping) -> dict:
            values = {_s(k): _num(v) for k, v in raw.items()}
            return {**{f: int(values.get(f, 0)) for f in FIELDS},
                    **{k: v for k, v in values.items() if k not in FIELDS}}

        out: dict = {"cluster": parse(cluster), "nodes": {}, "hosts": {}}
        for name, raw in zip(names, hashes):
            if name.startswith(key_node_stats("")):
                out["nodes"][name[len(key_node_stats("")):]] = parse(raw)
            else:
                out["hosts"][name[len(key_host_stats("")):]] = parse(raw)
        return out

    # -- flushing ---------------------------------------------------------------

    async def flush(self) -> bool:
        """Send everything buffered in one MULTI/EXEC; True if Redis took it.

        On failure the batch goes back into the buffer and the index is
        marked degraded; this never raises for a Redis problem.
        """
        if not self.enabled:
            return True
        async with self._flush_lock:
            counters, ops, accesses = self._counters, list(self._ops), self._accesses
            self._counters, self._ops, self._accesses = {}, deque(), {}
            try:
                removed = await self._send(counters, ops, accesses)
            except _REDIS_ERRORS as e:
                self._restore(counters, ops, accesses)
                self._trouble("flush", e)
                return False
            except asyncio.CancelledError:
                self._restore(counters, ops, accesses)  # close() sends them in its last flush
                raise
            self._ok("flush")
            self._ok("refresh")  # Redis answers again; the next re-read would only confirm it
            await self._forget_unheld(removed)
            return True

    async def _send(self, counters: dict[str, dict[str, int]], ops: list[tuple],
                    accesses: dict[str, float]) -> list[str]:
        node = self.node_id
        pipe = self._client.pipeline(transaction=True)
        removed: list[str] = []
        for op in ops:
            if op[0] == "stored":
                _, key, url, host, size, at = op
                pipe.sadd(key_locations(key), node)
                pipe.hset(key_object(key), mapping={"url": url, "host": host, "size": size, "stored_at": f"{at:.3f}"})
                pipe.zadd(KEY_OBJECTS, {key: at}, gt=True)
            else:
                pipe.srem(key_locations(op[1]), node)
                removed.append(op[1])
        for key, at in accesses.items():
            # XX: an access never resurrects an object that no node holds any more.
            pipe.zadd(KEY_OBJECTS, {key: at}, xx=True, gt=True)
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
            pipe.hset(key_node_stats(node), "updated_at", f"{self._clock():.3f}")
        if len(pipe):
            await pipe.execute()
        return removed

    async def _forget_unheld(self, removed: list[str]) -> None:
        """Delete the metadata of objects that no node holds any more.

        WATCH makes it safe against a node storing the key at the same moment:
        its SADD aborts our EXEC and the metadata stays.
        """
        for key in dict.fromkeys(removed):
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    await pipe.watch(key_locations(key))
                    if await pipe.exists(key_locations(key)):
                        continue
                    pipe.multi()
                    pipe.delete(key_object(key))
                    pipe.zrem(KEY_OBJECTS, key)
                    await pipe.execute()
            except WatchError:
                continue
            except _REDIS_ERRORS as e:
                # Harmless leftover: locations() reads the (empty) set, not this hash.
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

    # -- lifecycle ------------------------------------------------------------

    async def start(self, *, first_read_timeout: float = 1.0) -> None:
        """Read the membership once (up to `first_read_timeout`) and start the background tasks.

        Never raises because Redis is down: the tasks keep trying with backoff.
        """
        if not self.enabled or self._tasks:
            return
        self._closing = False
        try:
            await asyncio.wait_for(self._refresh_membership(), timeout=first_read_timeout)
            self._ok("refresh")
        except _REDIS_ERRORS as e:
            self._trouble("refresh", e)
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="index-flush"),
            asyncio.create_task(self._watch_loop(), name="index-watch"),
            asyncio.create_task(self._refresh_loop(), name="index-refresh"),
        ]

    async def close(self, *, flush_timeout: float = 2.0) -> None:
        """Stop the tasks, try one last flush, and close the client if we made it."""
        # The flag, not only cancel(): redis-py can turn a cancellation that
        # lands inside a read into a ConnectionError, which the loops retry.
        self._closing = True
        tasks, self._tasks = self._tasks, []
        while tasks:
            for task in tasks:
                task.cancel()
            _, pending = await asyncio.wait(tasks, timeout=0.5)
            tasks = list(pending)
        if self.enabled:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.flush(), timeout=flush_timeout)
            if self._owns_client:
                with contextlib.suppress(*_REDIS_ERRORS):
                    await self._client.aclose()

    def _backoff(self, delay: float) -> float:
        return min(delay * 2, self._backoff_max)

    async def _flush_loop(self) -> None:
        delay = self._flush_interval
        while not self._closing:
            await asyncio.sleep(delay * random.uniform(0.8, 1.0))
            if await self.flush():
                delay = self._flush_interval
            else:
                delay = self._backoff(min(delay, self._backoff_max))

    async def _watch_loop(self) -> None:
        delay = 0.05
        while not self._closing:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(CHANNEL_RING)
                # Catch up on changes published while we were not subscribed.
                await self._refresh_membership()
                self._ok("watch")
                self._ok("refresh")
                delay = 0.05
                while not self._closing:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        await self._refresh_membership()
            except _REDIS_ERRORS as e:
                if self._closing:
                    return
                self._trouble("watch", e)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(delay * random.uniform(0.8, 1.0))
            delay = self._backoff(delay)

    async def _refresh_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._refresh_interval * random.uniform(0.8, 1.0))
            try:
                await self._refresh_membership()
                self._ok("refresh")
            except _REDIS_ERRORS as e:
                self._trouble("refresh", e)


# -- the embedded default for local mode ------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_listening(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return True
        except OSError:
            await asyncio.sleep(0.02)
    return False


async def _start_redis_server(exe: str, workdir: Path) -> tuple[str, Callable[[], Awaitable[None]]]:
    for _ in range(3):  # the free port can be taken between choosing and binding it
        port = _free_port()
        proc = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if await _wait_listening(port, proc, timeout=10):
            break
        proc.kill()
        proc.wait()
    else:
        raise IndexUnavailable(f"embedded redis-server ({exe}) did not start on 127.0.0.1 after 3 tries")

    async def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.to_thread(proc.wait, 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        log.info("embedded_index_stopped", kind="redis-server", port=port)

    return f"redis://127.0.0.1:{port}/0", stop


def _start_fakeredis() -> tuple[str, Callable[[], Awaitable[None]]]:
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    # Connection threads must not keep the process alive nor block closing.
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, name="nezha-fakeredis", daemon=True)
    thread.start()
    port = server.server_address[1]

    async def stop() -> None:
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        log.info("embedded_index_stopped", kind="fakeredis", port=port)

    return f"redis://127.0.0.1:{port}/0", stop


async def embedded_index(workdir: Path, *, kind: str = "auto") -> tuple[str, Callable[[], Awaitable[None]]]:
    """Start a local index for nodes that were given no --redis-url; returns (url, async stop).

    `kind`: "redis-server" (the installed binary, on a free port of
    127.0.0.1), "fakeredis" (fakeredis' TCP server in a thread of this
    process, so a fresh machine needs nothing installed), or "auto": the
    first if installed, else the second. Either way several node processes
    share it through the URL.
    """
    if kind not in ("auto", "redis-server", "fakeredis"):
        raise ConfigError(f"embedded index kind must be auto, redis-server or fakeredis, got {kind!r}")
    exe = shutil.which("redis-server") if kind in ("auto", "redis-server") else None
    if kind == "redis-server" and exe is None:
        raise ConfigError("embedded index kind redis-server asked for, but redis-server is not installed")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if exe is not None:
        url, stop = await _start_redis_server(exe, workdir)
        chosen = "redis-server"
    else:
        url, stop = _start_fakeredis()
        chosen = "fakeredis"
    log.info("embedded_index_started", kind=chosen, url=url)
    return url, stop
