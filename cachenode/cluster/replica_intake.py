"""Receiving a batch of small objects' replicas: each record checked, then committed alone.

The other half of cluster/replica_batches.py. `POST /_nezha/replicas`
(cluster token, as every internal endpoint: front/routes.py) carries records
framed as cluster/replica_frames.py says. Each is read, checked against its
sender's CRC32C and committed to the store on its own, so a damaged record
is refused (counted as `nezha_corrupt_objects_total{found_by="copy"}` and
logged as `corrupt_copy`) while the records around it are stored.

The answer streams one JSON line per record as it is decided,
`{"i": <index>, "result": <ReplicateResult or "failed: why">}`, then
`{"records": n, "copied": c}`: a sender cut off mid-batch knows which of its
records landed and copies the others one by one.

A record is committed as the sender stored it: the same expiry, the same
age, the same variant; the store gives it a file name of its own and says
whether it is an extra copy here. One the store holds fresh already is
`present`. One whose key a fill here is fetching right now is left to that
fill and answered as failed, so the sender's one-by-one copy joins it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import structlog
from aiohttp import web

from cachenode.cluster.replica_frames import HEAD_SIZE, BrokenFrame, Damaged, Head, open_record, read_head
from cachenode.counts import Counts
from cachenode.fill.flights import Flights
from cachenode.http.vary import selecting_headers
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, NotStored
from nezha.chunks import chunk_of
from nezha.config import CacheSettings
from nezha.errors import NezhaError
from nezha.keys import key_for, target_of
from nezha.wire import PEER_HEADER, ReplicateResult, replicate_failed

log = structlog.get_logger("nezha.handoff")


class ReplicaIntake:
    """Given what a commit uses: the store, the flights in progress, the counts, the origins configured."""

    def __init__(self, *, settings: CacheSettings, store: Store, flights: Flights, counts: Counts) -> None:
        self.settings = settings
        self.store = store
        self.flights = flights
        self.counts = counts

    async def endpoint(self, request: web.Request) -> web.StreamResponse:
        """POST /_nezha/replicas: commit each record of the body; one line per record, then a summary."""
        source = request.headers.get(PEER_HEADER, request.remote or "?")
        started = time.monotonic()
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        tally = {"copied": 0, "present": 0, "failed": 0, "bytes": 0}
        n = 0
        broken: str | None = None
        try:
            while True:
                try:
                    raw = await request.content.readexactly(HEAD_SIZE)
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        broken = f"the body ends inside a record's head ({len(e.partial)} bytes)"
                    break
                try:
                    head = read_head(raw)
                    payload = await request.content.readexactly(head.payload)
                except BrokenFrame as e:
                    broken = str(e)
                    break
                except asyncio.IncompleteReadError as e:
                    broken = f"the body ends inside record {n} ({len(e.partial)} of {head.payload} bytes)"
                    break
                result = await self._one(head, payload, source=source)
                if result == ReplicateResult.COPIED:
                    tally["copied"] += 1
                    tally["bytes"] += head.body_len
                elif result == ReplicateResult.PRESENT:
                    tally["present"] += 1
                else:
                    tally["failed"] += 1
                await resp.write(json.dumps({"i": n, "result": result}).encode() + b"\n")
                n += 1
            await resp.write(json.dumps({"records": n, "copied": tally["copied"],
                                         **({"error": broken} if broken else {})}).encode() + b"\n")
            await resp.write_eof()
        except ConnectionResetError:
            broken = broken or "the sender went away"
        log.info("replica_batch_received", source=source, records=n, **tally,
                 seconds=round(time.monotonic() - started, 3), **({"error": broken} if broken else {}))
        return resp

    async def _one(self, head: Head, payload: bytes, *, source: str) -> str:
        """Commit one record; its ReplicateResult, or replicate_failed(why)."""
        try:
            record, body = open_record(head, payload)
        except Damaged as e:
            key = _key_in(payload[:head.meta_len])
            log.error("corrupt_copy", key=key, source=source, error=f"batched record: {e}")
            self.store.corrupt("copy")
            return replicate_failed(f"damaged on the way: {e}")
        try:
            meta = self._meta(record, len(body))
        except ValueError as e:
            log.warning("replica_refused", key=str(record.get("key"))[:300], source=source, error=str(e))
            return replicate_failed(e)
        if self.flights.get(meta.key) is not None:
            return replicate_failed(f"{meta.key} is being fetched here")
        selecting = selecting_headers(meta.vary, meta.variant)
        held = self.store.lookup(meta.key, selecting) if selecting is not None else None
        if held is not None and not held.hot and held.fresh(time.time()):
            return ReplicateResult.PRESENT
        try:
            # Nobody reads a record's temp file while it is written: a reading descriptor
            # would stay open for good, one per object received (a hand-off sends a million).
            async with self.store.writing(reserve=len(body), readable=False) as write:
                await self.store.write(write.temp, body)
                stored = await write.commit(meta)
        except NotStored as e:
            return replicate_failed(e)
        except NezhaError as e:
            log.warning("replica_not_stored", key=meta.key, source=source, error=str(e))
            return replicate_failed(e)
        self.counts.stored(stored, self.store.sizes())
        return ReplicateResult.COPIED

    def _meta(self, record: dict, size: int) -> Meta:
        """The Meta a record names, as this node stores it; ValueError naming what does not hold."""
        try:
            meta = Meta(**record)
        except TypeError as e:
            raise ValueError(f"not an object's record: {e}") from e
        key = meta.key
        if not isinstance(key, str) or chunk_of(key) is not None or meta.chunk_size:
            raise ValueError(f"{str(key)[:200]!r} is no object stored whole")
        target = target_of(key)
        origin = self.settings.origin_table.get(target.host)
        if origin is None or meta.host != target.host:
            raise ValueError(f"host {target.host!r} of {key} is not a configured origin here")
        if key_for(target, origin) != key:
            raise ValueError(f"{key} is not the key this node gives its URL")
        if meta.size != size:
            raise ValueError(f"{key}: its record says {meta.size} bytes, the body has {size}")
        if meta.vary and selecting_headers(meta.vary, meta.variant) is None:
            raise ValueError(f"{key}: its variant cannot be spelled as request fields")
        # A replica, never a hot copy; the store names its file and says whether it is an extra copy.
        return replace(meta, hot=False, extra=False, data="", blocks="")


def _key_in(meta: bytes) -> str:
    """The key a damaged record's meta may still name, for the log line."""
    try:
        return str(json.loads(meta).get("key"))[:300]
    except (ValueError, AttributeError):
        return "?"
