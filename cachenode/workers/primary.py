"""The writing worker's side of a node's workers (docs/cache-node.md, "Workers").

One worker, the primary, is the node as it always was: it alone fills,
writes and evicts the store, keeps the node's counters and its place in the
ring. The other workers (followers, cachenode/workers/follower.py) answer
plain hits from the same disk, and hand every other connection here with
its file descriptor, so each request the fast path cannot answer is served
by the one process that holds the fills: coalescing, capacity and counting
stay exact because there is one of each.

What a follower needs to find hits is a copy of the store's index: it gets
the whole index when it joins, then every change in order (`Store.watchers`).
What the primary needs of a follower is the connections it hands over and
the hits it served, to count: batched every 50 ms, and flushed before
`/metrics` answers (`counted`), so a scrape misses no hit answered before it
and counts none twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from dataclasses import asdict
from typing import Callable

import structlog

from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.workers.channel import MAX_RECORD, Channel

log = structlog.get_logger("nezha.workers")


def meta_records(metas: list[Meta], event: str) -> list[dict]:
    """`metas` as records of at most MAX_RECORD bytes each. A meta too large
    for any record goes as a drop: the follower then hands its requests
    here, which is slower and still exact."""
    records: list[dict] = []
    batch: list[dict] = []
    size = 0
    for meta in metas:
        raw = asdict(meta)
        n = len(json.dumps(raw, separators=(",", ":")))
        if n > MAX_RECORD - 256:
            records.append({"t": "drop", "metas": [raw | {"headers": []}]})
            continue
        if batch and size + n > MAX_RECORD - 256:
            records.append({"t": event, "metas": batch})
            batch, size = [], 0
        batch.append(raw)
        size += n + 1
    if batch:
        records.append({"t": event, "metas": batch})
    return records


class Followers:
    """The primary's links: to the supervisor (which sends one new link per
    follower it starts) and to each follower."""

    def __init__(self, *, control: socket.socket, store: Store,
                 adopt: Callable[..., None],
                 count_hit: Callable[[str, str, bool, int, float | None], None],
                 handed: Callable[[], None] = lambda: None,
                 tls_outcome: Callable[[str], None] = lambda outcome: None,
                 tls_fallback: Callable[[str], None] = lambda reason: None) -> None:
        self.store = store
        self._handed = handed
        self._tls_outcome = tls_outcome
        self._tls_fallback = tls_fallback
        self._adopt = adopt
        self._count_hit = count_hit
        self._control_sock = control
        self.control: Channel | None = None
        self.links: dict[int, Channel] = {}
        self._partial: dict[int, tuple[int, bytearray, bool, bool, int]] = {}  # follower -> (fd, bytes, eof, secure, parts left)
        self._flushes: dict[tuple[int, int], asyncio.Future] = {}  # (follower, number) -> its answer
        self._flush_number = 0

    def start(self) -> None:
        self.control = Channel(self._control_sock, on_record=self._from_supervisor,
                               on_closed=lambda: log.warning("supervisor_gone"))
        self.store.watchers.append(self._changed)

    def ready(self) -> None:
        """Tell the supervisor this worker serves."""
        assert self.control is not None
        self.control.send({"t": "ready", "worker": 0})

    def close(self) -> None:
        if self._changed in self.store.watchers:
            self.store.watchers.remove(self._changed)
        for link in list(self.links.values()):
            link.close()
        if self.control is not None:
            self.control.close()

    # -- the supervisor's link -------------------------------------------------
    def _from_supervisor(self, head: dict, tail: bytes, fds: list[int]) -> None:
        if head.get("t") == "follower" and len(fds) == 1:
            self._join(int(head["worker"]), socket.socket(fileno=fds[0]))
            return
        for fd in fds:
            os.close(fd)
        log.error("worker_record_unknown", record=head.get("t"), origin="supervisor")

    def _join(self, worker: int, sock: socket.socket) -> None:
        old = self.links.pop(worker, None)
        if old is not None:
            old.close()
        link = Channel(sock, on_record=lambda h, t, f: self._from_follower(worker, h, t, f),
                       on_closed=lambda: self._left(worker, link))
        self.links[worker] = link
        for record in meta_records(self.store.metas(), "put"):
            link.send(record)
        link.send({"t": "synced"})
        log.info("worker_joined", worker=worker, objects=len(self.store))

    async def counted(self, timeout: float = 1.0) -> None:
        """Return once every hit a follower had answered when this was called is
        counted here: /metrics waits for it, so a scrape is exact for every
        request answered before it. Each link is ordered, so a follower's
        "flushed" comes after the hits it sent before it. A follower that does
        not answer within `timeout` (stuck, or dying) is not waited for."""
        if not self.links:
            return
        self._flush_number += 1
        n = self._flush_number
        loop = asyncio.get_running_loop()
        waits = []
        for worker, link in self.links.items():
            waiter = self._flushes[(worker, n)] = loop.create_future()
            link.send({"t": "flush", "n": n})
            waits.append(waiter)
        try:
            await asyncio.wait(waits, timeout=timeout)
        finally:
            for worker in list(self.links):
                self._flushes.pop((worker, n), None)

    def _left(self, worker: int, link: Channel) -> None:
        for (who, n), waiter in list(self._flushes.items()):
            if who == worker and not waiter.done():
                waiter.set_result(None)  # gone: nothing more will be counted from it
        if self.links.get(worker) is link:
            del self.links[worker]
        partial = self._partial.pop(worker, None)
        if partial is not None:
            os.close(partial[0])

    def _changed(self, event: str, meta: Meta) -> None:
        if not self.links:
            return
        for record in meta_records([meta], event):
            for link in self.links.values():
                link.send(record)

    # -- a follower's link -------------------------------------------------------
    def _from_follower(self, worker: int, head: dict, tail: bytes, fds: list[int]) -> None:
        kind = head.get("t")
        if kind == "conn" and len(fds) == 1:
            stale = self._partial.pop(worker, None)
            if stale is not None:
                os.close(stale[0])
            self._handed()
            more, eof, secure = int(head.get("more", 0)), bool(head.get("eof")), bool(head.get("secure"))
            if more:
                self._partial[worker] = (fds[0], bytearray(tail), eof, secure, more)
            else:
                self._adopt(fds[0], tail, eof, secure=secure)
            return
        for fd in fds:
            os.close(fd)
        if kind == "more" and worker in self._partial:
            fd, data, eof, secure, left = self._partial.pop(worker)
            data += tail
            if left > 1:
                self._partial[worker] = (fd, data, eof, secure, left - 1)
            else:
                self._adopt(fd, bytes(data), eof, secure=secure)
        elif kind == "hits":
            for host, key, slot, hot, sent, first_byte in head.get("h", []):
                self.store.touch(slot)
                self._count_hit(host, key, bool(hot), int(sent), first_byte)
        elif kind == "tls":
            self._tls_outcome(str(head.get("outcome")))
        elif kind == "fallback":
            self._tls_fallback(str(head.get("reason")))
        elif kind == "flushed":
            waiter = self._flushes.pop((worker, int(head.get("n", -1))), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif kind == "ready":
            if self.control is not None:
                self.control.send({"t": "ready", "worker": worker})
        else:
            log.error("worker_record_unknown", record=kind, worker=worker)


def attach_followers(control: socket.socket):
    """What `cachenode.app.serve` calls once the primary serves: its links
    started and the supervisor told; returns what closes them."""
    def attach(node, listener) -> Callable[[], None]:
        metrics = node.metrics
        followers = Followers(control=control, store=node.store, adopt=listener.adopt_handed,
                              count_hit=node.handler.count_fast_hit, handed=metrics.worker_handovers.inc,
                              tls_outcome=lambda outcome: metrics.tls_connections.labels(outcome).inc(),
                              tls_fallback=lambda reason: metrics.parent_fallbacks.labels(reason=reason).inc())
        followers.start()
        node.handler.before_metrics = followers.counted
        node.supervisor = os.getppid()  # /readyz names it: the node's process, to whoever started it
        followers.ready()
        return followers.close

    return attach
