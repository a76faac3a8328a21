"""Ring membership in Redis: read and watched by every node and the controller, written under a fence.

Membership is learned two ways, so a reader misses no change: a pub/sub
message on `nezha:ring:changed` (the fast path, milliseconds) and a periodic
re-read every `refresh_interval` (the fallback when a message was lost, e.g.
while the subscription was reconnecting). Reads are serialised, and each one
adopts whatever Redis holds if it differs from the last known membership;
with Redis gone a reader keeps the last membership it had.

Writes replace the whole membership and bump the epoch in one MULTI. The
controller writes with a `Fence` (its Lease generation and identity), checked
in the same transaction, so a controller that lost its Lease cannot write,
even late. Without Redis (a disabled connection) membership lives in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

import structlog
from redis.exceptions import WatchError

from nezha.cancels import stop_if_cancelled
from nezha.config import parse_hostport
from nezha.errors import ConfigError, NezhaError
from nezha.index.connection import REDIS_ERRORS, Connection, text
from nezha.index.schema import (CHANNEL_RING, KEY_EPOCH, KEY_FENCE, KEY_LEAVING, KEY_NODES, KEY_REPLICAS,
                                KEY_WEIGHTS)
from nezha.ring import Membership

log = structlog.get_logger("nezha.index")

UNCHANGED = object()  # set_membership(replicas=UNCHANGED): leave nezha:ring:replicas as it is

# The reads that bring a node a new membership, named in its `membership_changed` line (`via`): a message on
# the channel (the fast path), the catch-up read on (re)subscribing, the periodic re-read (the fallback:
# a change arriving this way means its message was lost), the read at start, and this process's own write.
Via = Literal["published", "subscribed", "reread", "first_read", "written"]
VIA: tuple[str, ...] = get_args(Via)


class Deposed(NezhaError):
    """A ring write or claim by a controller that no longer leads: refused by the fence."""


@dataclass(frozen=True)
class Fence:
    """The leader's right to write the ring: its Lease generation and identity."""

    generation: int
    holder: str


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
    values = {text(k): text(v) for k, v in (raw or {}).items()}
    try:
        return Fence(generation=int(values["generation"]), holder=values["holder"])
    except (KeyError, ValueError):
        return None


class MembershipWatch:
    """The membership this process knows, kept current from Redis; callbacks on every change."""

    def __init__(self, conn: Connection, *, refresh_interval: float, backoff_max: float) -> None:
        self.conn = conn
        self.membership: Membership | None = None
        self._refresh_interval = refresh_interval
        self._backoff_max = backoff_max
        self._callbacks: list[Callable[[Membership], None]] = []
        self.lock = asyncio.Lock()  # reads and the writer's own adoption, one at a time

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

    def adopt(self, membership: Membership, *, via: Via) -> None:
        """Make `membership` the known one, if it differs; `via` names the read that brought it (VIA).
        Checked: an operator reads `via=reread` as a lost ring message, so a misspelt value would mislead."""
        if via not in VIA:
            raise ValueError(f"membership_changed via={via!r} is none of {', '.join(VIA)}")
        if membership == self.membership:
            return
        self.membership = membership
        log.info("membership_changed", epoch=membership.epoch, nodes=sorted(membership.nodes), via=via)
        for callback in list(self._callbacks):
            self._notify(callback, membership)

    async def _read(self) -> Membership | None:
        pipe = self.conn.client.pipeline(transaction=True)
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
                replicas = int(text(raw_replicas))
            except ValueError:
                replicas = 0
            if replicas < 1:
                log.warning("ring_replicas_invalid", key=KEY_REPLICAS, value=text(raw_replicas))
                replicas = None
        nodes = {text(k): text(v) for k, v in nodes.items()}
        raw_weights = {text(k): text(v) for k, v in weights.items()}
        clean: dict[str, int] = {}
        for node in nodes:
            try:
                clean[node] = max(int(raw_weights.get(node, "1")), 1)
            except ValueError:
                log.warning("ring_weight_invalid", node=node, weight=raw_weights[node])
                clean[node] = 1
        return Membership(epoch=int(text(epoch)), nodes=nodes, weights=clean, replicas=replicas,
                          leaving=frozenset(text(n) for n in leaving or ()))

    async def refresh(self, *, via: Via) -> None:
        async with self.lock:
            membership = await self._read()
            if membership is not None:
                self.adopt(membership, via=via)

    async def get_membership(self) -> Membership | None:
        """Membership as Redis holds it now (None if never written); the local one when disabled."""
        if not self.conn.enabled:
            return self.membership
        try:
            return await self._read()
        except REDIS_ERRORS as e:
            self.conn.unavailable("read ring membership from", e)

    async def first_read(self, timeout: float) -> None:
        """One read before serving, bounded: a dead Redis only marks the index degraded."""
        try:
            await asyncio.wait_for(self.refresh(via="first_read"), timeout=timeout)
            self.conn.ok("refresh")
        except REDIS_ERRORS as e:
            await self.conn.trouble("refresh", e)

    def _backoff(self, delay: float) -> float:
        return min(delay * 2, self._backoff_max)

    async def watch_loop(self) -> None:
        delay = 0.05
        conn = self.conn
        while not conn.closing:
            stop_if_cancelled()  # a Redis call in the last round may have swallowed it (nezha/cancels.py)
            pubsub = conn.client.pubsub()
            try:
                await pubsub.subscribe(CHANNEL_RING)
                # Catch up on changes published while we were not subscribed.
                await self.refresh(via="subscribed")
                conn.ok("watch")
                conn.ok("refresh")
                delay = 0.05
                while not conn.closing:
                    stop_if_cancelled()
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        await self.refresh(via="published")
            except REDIS_ERRORS as e:
                stop_if_cancelled()  # redis-py may have turned the cancellation into a ConnectionError
                if conn.closing:
                    return
                await conn.trouble("watch", e)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(delay * random.uniform(0.8, 1.0))
            delay = self._backoff(delay)

    async def refresh_loop(self) -> None:
        while not self.conn.closing:
            stop_if_cancelled()  # the last refresh may have swallowed it (nezha/cancels.py)
            await asyncio.sleep(self._refresh_interval * random.uniform(0.8, 1.0))
            try:
                await self.refresh(via="reread")
                self.conn.ok("refresh")
            except REDIS_ERRORS as e:
                await self.conn.trouble("refresh", e)


class MembershipWriter:
    """Writes of the whole membership: the controller's (fenced), `nezha ring set` and `nezha up`."""

    def __init__(self, watch: MembershipWatch) -> None:
        self.watch = watch
        self.conn = watch.conn

    async def claim_fence(self, fence: Fence) -> Fence | None:
        """Make `fence` the only one whose ring writes are taken.

        Taken when the stored generation is lower (a new leader), or equal
        with the same holder (a renewal). Returns None when taken, else the
        stored fence that is newer: the caller is deposed, or (a Lease made
        anew, whose count restarted) must raise its generation above it.
        """
        async with self.conn.client.pipeline(transaction=True) as pipe:
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
                return _fence_of(await self.conn.client.hgetall(KEY_FENCE)) or fence
            except REDIS_ERRORS as e:
                self.conn.unavailable("claim the ring fence in", e)
        log.info("ring_fence_claimed", generation=fence.generation, holder=fence.holder)
        return None

    def _adopt_written(self, epoch: int, nodes: dict[str, str], weights: dict[str, int], replicas, leaving) -> None:
        """What this process just wrote becomes what it knows (called under the watch's lock)."""
        held = self.watch.membership
        kept = held.replicas if held else None
        gone = held.leaving if held else frozenset()
        self.watch.adopt(Membership(epoch=epoch, nodes=nodes, weights=weights,
                                    replicas=kept if replicas is UNCHANGED else replicas,
                                    leaving=gone if leaving is UNCHANGED else frozenset(leaving)), via="written")

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
        conn = self.conn
        if not conn.enabled:
            async with self.watch.lock:
                held = self.watch.membership
                epoch = (held.epoch if held else 0) + 1
                self._adopt_written(epoch, nodes, weights, replicas, leaving)
            return epoch
        try:
            async with conn.client.pipeline(transaction=True) as pipe:
                if fence is not None:
                    await self._hold_fence(pipe, fence)
                _queue_ring_write(pipe, nodes, weights, replicas, leaving)
                epoch = int((await pipe.execute())[0])
        except WatchError as e:
            raise Deposed(f"ring write refused: the fence in {conn.where} changed during the write") from e
        except REDIS_ERRORS as e:
            conn.unavailable("write ring membership to", e)
        try:
            await conn.client.publish(CHANNEL_RING, str(epoch))
        except REDIS_ERRORS as e:
            # Written but not announced: nodes still see it at their next re-read.
            log.warning("ring_publish_failed", epoch=epoch, error=str(e))
        async with self.watch.lock:
            held = self.watch.membership
            if held is None or held.epoch < epoch:
                self._adopt_written(epoch, nodes, weights, replicas, leaving)
        log.info("ring_written", epoch=epoch, nodes=sorted(nodes))
        return epoch

    async def _hold_fence(self, pipe, fence: Fence) -> None:
        """Watch the fence in `pipe` and start its transaction, if Redis holds
        exactly `fence`; else Deposed (another controller took the ring)."""
        await pipe.watch(KEY_FENCE)
        stored = _fence_of(await pipe.hgetall(KEY_FENCE))
        if stored != fence:
            await pipe.unwatch()
            raise Deposed(f"ring write refused: {self.conn.where} holds the fence of "
                          f"{stored.holder if stored else 'nobody'} (generation "
                          f"{stored.generation if stored else '-'}), not {fence.holder} "
                          f"(generation {fence.generation})")
        pipe.multi()

    async def clear_membership(self, *, if_nodes: Mapping[str, str]) -> bool:
        """Remove the ring, if it is still `if_nodes` (nobody replaced it meanwhile); True if removed.

        For `nezha up` on exit: the ring named its nodes, which are gone. The
        epoch moves on, so a node that still listens sees the change.
        """
        if not self.conn.enabled:
            return False
        try:
            async with self.conn.client.pipeline(transaction=True) as pipe:
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
        except REDIS_ERRORS as e:
            self.conn.unavailable("remove the ring from", e)
        log.info("ring_removed", nodes=sorted(if_nodes))
        return True


def _queue_ring_write(pipe, nodes: dict[str, str], weights: dict[str, int], replicas, leaving) -> None:
    """Queue one ring write in `pipe`'s transaction: the epoch bumped, the
    nodes and weights replaced, and `replicas` and `leaving` unless UNCHANGED."""
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
