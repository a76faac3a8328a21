"""Pushing small objects' replicas to a peer in batches: one request for many objects.

A replica of an object is otherwise copied by two exchanges: this node asks
the peer to copy it (`POST /_nezha/replicate`), and the peer asks this node
for its bytes. For a 16 KiB JPEG of an image dataset those exchanges cost
more than its bytes. So a small object (a sealed file, cachenode/store/small.py)
filled here waits a moment beside the others bound for the same peer, and
they travel together in one `POST /_nezha/replicas` whose records
(cluster/replica_frames.py) the peer checks and commits one by one
(cluster/replica_intake.py). Large objects keep the one-by-one path.

A batch leaves when it holds `max_records` objects (`replica_batch`, 64) or `max_bytes` bytes,
or `delay` after its first object came, whichever is first; one batch per
peer is on its way at a time, and the next gathers meanwhile. Its bodies
are read from this node's disk when it leaves, each file's seal checked
(a damaged one is not sent); an object evicted or replaced meanwhile is
not sent either.

Nothing is lost when a batch fails: the objects stay on this node, and
each record the peer did not answer as copied or present (it refused it,
or died, or the connection broke before its line came) is copied once
more by the one-by-one path, which reports its own failure
(`replicate_failed`) as it always has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine

import aiohttp
import structlog

from cachenode.peers.auth import peer_auth
from cachenode.cluster.replica_frames import CONTENT_TYPE, encode
from cachenode.fill.origin import OriginClient
from cachenode.store import small
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.store.sealed import Unsealed, unseal
from nezha.cancels import stop_if_cancelled
from nezha.chunks import chunk_of
from nezha.config import CacheSettings
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import PEER_HEADER, REPLICAS_PATH, ReplicateResult, replicate_failed

log = structlog.get_logger("nezha.handoff")

# A batch's bounds besides its count (`replica_batch`): whichever comes
# first. A replica exists for the day its owner dies; 0.2 s later than its
# fill is no loss, and gathers 11-13 objects a request from three nodes
# filling about 500 a second on a loaded machine (bench/cluster.py
# --replication; docs/benchmarks.md, "Replicas of small objects"); in the
# process test's burst, 0.01 s gathered about 4 and 0.2 s about 10.
BATCH_BYTES = 4 << 20
BATCH_DELAY = 0.2
RETRY_PARALLEL = 4  # one-by-one copies at a time of a batch's unanswered records
SILENCE = 10.0  # seconds without a byte of the peer's answer before the batch is given up

OneByOne = Callable[[Peer, Target, dict[str, str]], Awaitable[str]]


@dataclass
class _Item:
    meta: Meta
    target: Target
    selecting: dict[str, str]
    at: float  # loop time it came
    # How its copy ended: a ReplicateResult, replicate_failed(why), or None
    # when it was no longer stored as it was when it came (evicted, replaced).
    done: asyncio.Future[str | None]

    def end(self, result: str | None) -> None:
        if not self.done.done():
            self.done.set_result(result)


@dataclass
class _Queue:
    """What waits for one peer: its objects, their bytes, and the sender draining them."""

    items: list[_Item] = field(default_factory=list)
    bytes: int = 0
    full: asyncio.Event = field(default_factory=asyncio.Event)
    sender: asyncio.Task | None = None


class ReplicaBatches:
    """Given what it uses: this node's store (the bodies), the client it asks
    peers with, how to run background work, and the one-by-one copy
    (`Replicas.ask_to_copy`) that a record not copied by its batch falls back to."""

    def __init__(self, *, node_id: str, settings: CacheSettings, store: Store, client: OriginClient,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task], one_by_one: OneByOne,
                 max_records: int | None = None, max_bytes: int = BATCH_BYTES, delay: float = BATCH_DELAY) -> None:
        self.node_id = node_id
        self.settings = settings
        self.store = store
        self.client = client
        self.spawn = spawn
        self.one_by_one = one_by_one
        # 0 (settings.replica_batch): no batches, every replica goes one by one.
        self.max_records = settings.replica_batch if max_records is None else max_records
        self.max_bytes = max_bytes
        self.delay = delay
        self._queues: dict[str, _Queue] = {}

    def takes(self, meta: Meta) -> bool:
        """Whether `meta`'s replicas travel in batches: a small object stored whole in a sealed file."""
        return self.max_records > 0 and small.is_sealed(meta) and meta.size <= self.max_bytes and not meta.chunk_size \
            and chunk_of(meta.key) is None

    def add(self, peer: Peer, meta: Meta, target: Target, selecting: dict[str, str]) -> asyncio.Future[str | None]:
        """Send `meta`'s object to `peer` with the next batch bound there. How
        its copy ended, for who waits (a hand-off): a ReplicateResult, or
        replicate_failed(why) once the one-by-one path failed too, or None
        when it was evicted or replaced before its batch left."""
        loop = asyncio.get_running_loop()
        queue = self._queues.setdefault(peer.id, _Queue())
        item = _Item(meta, target, selecting, loop.time(), loop.create_future())
        queue.items.append(item)
        queue.bytes += meta.size
        if len(queue.items) >= self.max_records or queue.bytes >= self.max_bytes:
            queue.full.set()
        if queue.sender is None:
            queue.sender = self.spawn(self._drain(peer, queue))
        return item.done

    async def _drain(self, peer: Peer, queue: _Queue) -> None:
        """Send `peer`'s batches one after another until its queue is empty."""
        try:
            loop = asyncio.get_running_loop()
            while queue.items:
                stop_if_cancelled()  # a send in the last round may have swallowed it (nezha/cancels.py)
                wait = queue.items[0].at + self.delay - loop.time()  # the oldest waits `delay` at most
                if wait > 0 and not queue.full.is_set():
                    # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a
                    # cancellation that lands as the queue fills (nezha/cancels.py).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await queue.full.wait()
                batch = self._take(queue)
                try:
                    await self._send(peer, batch)
                except Exception as e:  # a bug, not a peer's failure: the objects stay here all the same
                    log.error("replicas_not_sent", peer=peer.id, records=len(batch), error=f"{type(e).__name__}: {e}")
                    for item in batch:
                        item.end(replicate_failed(f"{type(e).__name__}: {e}"))
                except asyncio.CancelledError:
                    for item in batch:
                        item.end(replicate_failed(f"{self.node_id} is stopping"))
                    raise
        except asyncio.CancelledError:  # the node stops: who waits (a hand-off) learns it
            for item in queue.items:
                item.end(replicate_failed(f"{self.node_id} is stopping"))
            raise
        finally:
            queue.sender = None  # no await since the loop found the queue empty: nothing came meanwhile

    def _take(self, queue: _Queue) -> list[_Item]:
        """The next batch: the oldest objects, within the bounds (one at least)."""
        n, size = 0, 0
        for item in queue.items:
            if n and (n >= self.max_records or size + item.meta.size > self.max_bytes):
                break
            n += 1
            size += item.meta.size
        batch, queue.items = queue.items[:n], queue.items[n:]
        queue.bytes -= size
        if len(queue.items) < self.max_records and queue.bytes < self.max_bytes:
            queue.full.clear()
        return batch

    async def _send(self, peer: Peer, batch: list[_Item]) -> None:
        started = time.monotonic()
        sending = await self._bodies(batch)
        if not sending:
            return
        results, error = await self._post(peer, b"".join(encode(small.record_of(meta), body)
                                                         for _, meta, body in sending))
        tally = {"copied": 0, "present": 0}
        again = []
        for i, (item, _, _) in enumerate(sending):
            result = results.get(i)
            if result in (ReplicateResult.COPIED, ReplicateResult.PRESENT):
                tally[str(result)] += 1
                item.end(result)
            else:
                again.append(item)
        log.info("replicas_sent", peer=peer.id, records=len(sending), **tally, again=len(again),
                 bytes=sum(len(body) for *_, body in sending), seconds=round(time.monotonic() - started, 3),
                 **({"error": error} if error else {}))
        if again:
            self.spawn(self._one_by_one(peer, again))

    async def _one_by_one(self, peer: Peer, items: list[_Item]) -> None:
        """Copy the records a batch did not, through the one-by-one path (which logs each failure)."""
        gate = asyncio.Semaphore(RETRY_PARALLEL)

        async def one(item: _Item) -> None:
            async with gate:
                try:
                    item.end(await self.one_by_one(peer, item.target, item.selecting))
                finally:
                    item.end(replicate_failed(f"{self.node_id} is stopping"))

        await asyncio.gather(*(one(item) for item in items))

    async def _bodies(self, batch: list[_Item]) -> list[tuple[_Item, Meta, bytes]]:
        """Each object of `batch` still stored as it was, with its body read
        from disk (in one trip to a thread) and its seal checked."""
        held = []
        for item in batch:
            current = self.store.lookup(item.meta.key, item.selecting)
            if current is not None and current.data == item.meta.data and not current.hot:
                held.append((item, current, self.store.data_path(current)))
            else:
                item.end(None)
        if not held:
            return []
        bodies = await asyncio.get_running_loop().run_in_executor(None, _read_all, [p for *_, p in held])
        sending = []
        for (item, meta, path), body in zip(held, bodies):
            if isinstance(body, str) or len(body) != meta.size:
                # Evicted meanwhile (its file gone), or damaged at rest: a read or the scrub finds it there.
                why = body if isinstance(body, str) else f"{len(body)} bytes, not {meta.size}"
                log.warning("replica_not_sent", key=meta.key, path=path, error=why)
                item.end(replicate_failed(f"not sent: {why}"))
                continue
            sending.append((item, meta, body))
        return sending

    async def _post(self, peer: Peer, body: bytes) -> tuple[dict[int, str], str | None]:
        """Send one batch; each record's result by its index, and what cut the answer short."""
        results: dict[int, str] = {}
        headers = {"Content-Type": CONTENT_TYPE, PEER_HEADER: self.node_id, **peer_auth(self.settings.cluster_token)}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.peer_timeout, sock_read=SILENCE)
        try:
            r = await self.client.request("POST", peer.url + REPLICAS_PATH, headers=headers, data=body,
                                          what=f"peer {peer.id} replicas", timeout=timeout)
        except Exception as e:  # noqa: BLE001 - any failure only means the one-by-one path copies them
            return results, f"{type(e).__name__}: {e}"
        try:
            if r.status != 200:
                return results, f"{r.status} {(await r.text())[:200]}"
            async for line in r.content:
                if not line.strip():
                    continue
                message = json.loads(line)
                if isinstance(message, dict) and isinstance(message.get("i"), int):
                    results[message["i"]] = str(message.get("result"))
                elif isinstance(message, dict) and "records" in message:
                    return results, message.get("error")
            return results, f"{peer.id} ended its answer after {len(results)} records, with no summary"
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return results, f"{type(e).__name__} after {len(results)} records: {e}"
        finally:
            r.release()


def _read_all(paths: list[str]) -> list[bytes | str]:
    """Blocking: each sealed file's body, its seal checked; a string saying why where it cannot be."""
    out: list[bytes | str] = []
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as f:
                whole = f.read()
            size, _ = unseal(whole)
            out.append(whole[:size])
        except (OSError, Unsealed) as e:
            out.append(f"{type(e).__name__}: {e}")
    return out

