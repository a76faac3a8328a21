"""The writing worker's side of a node's workers (docs/cache-node.md, "Workers").

One worker, the primary, is the node as it always was: it fills, writes
and evicts the store, keeps the node's counters and its place in the ring.
The other workers (followers, cachenode/workers/follower.py) answer plain
hits from the same disk, and hand every other connection here with its file
descriptor, so each request the fast path cannot answer is served by the
one process that holds the fills: coalescing, capacity and counting stay
exact because there is one of each. With `--follower-leads` a follower may
fill a small cold miss itself, on a grant from here that keeps the key in
flight here meanwhile, and only this worker admits what it wrote
(cachenode/workers/lead_desk.py).

What a follower needs to find hits is a copy of the store's index: it gets
the whole index when it joins, in slices of rows that cost the primary's
loop little however many objects it holds, then every change in order
(`Store.watchers`; cachenode/workers/index_feed.py).
What the primary needs of a follower is the connections it hands over and
the hits it served, to count: batched every 50 ms, and flushed before
`/metrics` answers (`counted`), so a scrape misses no hit answered before it
and counts none twice.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Callable

import structlog

from cachenode.store.disk import Store
from cachenode.workers.channel import Channel
from cachenode.workers.index_feed import IndexFeed, meta_records
from cachenode.workers.lead_desk import LeadDesk
from cachenode.workers.messages import (Back, Conn, Fallback, Flush, Flushed, Follower, Granted, Hits, Lead, LeadDone,
                                        Message, Missed, More, Ready, TlsOutcome, Unknown)

__all__ = ["FollowerLinks", "Followers", "Primary", "meta_records"]

log = structlog.get_logger("nezha.workers")


class FollowerLinks:
    """The primary's link to each follower, and how /metrics waits for their
    hits (`counted`). Built before the node, which is given `counted` at
    construction; the links join once the node serves (`Followers`)."""

    def __init__(self) -> None:
        self.links: dict[int, Channel] = {}
        self._flushes: dict[tuple[int, int], asyncio.Future] = {}  # (follower, number) -> its answer
        self._flush_number = 0

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
            link.send(Flush(n=n))
            waits.append(waiter)
        try:
            await asyncio.wait(waits, timeout=timeout)
        finally:
            for worker in list(self.links):
                self._flushes.pop((worker, n), None)

    def flushed(self, worker: int, n: int) -> None:
        waiter = self._flushes.pop((worker, n), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def send(self, worker: int, message: Message) -> None:
        """A record to `worker`, if its link is up."""
        link = self.links.get(worker)
        if link is not None and not link.closed:
            link.send(message)

    def left(self, worker: int, link: Channel) -> None:
        for (who, n), waiter in list(self._flushes.items()):
            if who == worker and not waiter.done():
                waiter.set_result(None)  # gone: nothing more will be counted from it
        if self.links.get(worker) is link:
            del self.links[worker]


class Followers:
    """The primary's links: to the supervisor (which sends one new link per
    follower it starts) and to each follower (`FollowerLinks`)."""

    def __init__(self, *, control: socket.socket, store: Store, follower_links: FollowerLinks,
                 adopt: Callable[..., None],
                 count_hit: Callable[[str, str, bool, int, float | None], None],
                 handed: Callable[[], None] = lambda: None,
                 gave_back: Callable[[], None] = lambda: None,
                 tls_outcome: Callable[[str], None] = lambda outcome: None,
                 tls_fallback: Callable[[str], None] = lambda reason: None,
                 desk: LeadDesk | None = None,
                 count_miss: Callable[[str, int, float | None], None] = lambda host, sent, first_byte: None) -> None:
        """`desk`: the leads of small cold fills followers ask for (workers/lead_desk.py);
        None: every ask is denied. `count_miss`: a miss a follower answered from its lead."""
        self.store = store
        self.desk = desk
        self._count_miss = count_miss
        self._handed, self._gave_back = handed, gave_back
        self._tls_outcome = tls_outcome
        self._tls_fallback = tls_fallback
        self._adopt = adopt
        self._count_hit = count_hit
        self._control_sock = control
        self.control: Channel | None = None
        self.closing = False  # this worker closes its links itself: the supervisor is not gone
        self.follower_links = follower_links
        self.links = follower_links.links
        self._partial: dict[int, tuple[int, bytearray, bool, bool, int]] = {}  # follower -> (fd, bytes, eof, secure, parts left)
        self.feed = IndexFeed(store, self.links)

    def start(self) -> None:
        self.control = Channel(self._control_sock, on_record=self._from_supervisor, on_closed=self._supervisor_gone)
        self.store.watchers.append(self.feed.changed)

    def ready(self) -> None:
        """Tell the supervisor this worker serves."""
        assert self.control is not None
        self.control.send(Ready(worker=0))

    def _supervisor_gone(self) -> None:
        if not self.closing:  # not on an ordinary stop, where this worker closes the link
            log.warning("supervisor_gone")

    def close(self) -> None:
        self.closing = True
        if self.feed.changed in self.store.watchers:
            self.store.watchers.remove(self.feed.changed)
        self.feed.close()
        for link in list(self.links.values()):
            link.close()
        if self.control is not None:
            self.control.close()

    # -- the supervisor's link -------------------------------------------------
    def _from_supervisor(self, message: Message | Unknown, tail: bytes, fds: list[int]) -> None:
        if isinstance(message, Follower) and len(fds) == 1:
            self._join(message.worker, socket.socket(fileno=fds[0]))
            return
        for fd in fds:
            os.close(fd)
        log.error("worker_record_unknown", record=_tag(message), origin="supervisor")

    def _join(self, worker: int, sock: socket.socket) -> None:
        old = self.links.pop(worker, None)
        if old is not None:
            old.close()
        link = Channel(sock, on_record=lambda h, t, f: self._from_follower(worker, h, t, f),
                       on_closed=lambda: self._left(worker, link))
        self.links[worker] = link
        self.feed.join(worker, link)

    def _back_to(self, worker: int) -> Callable[[asyncio.Transport], bool]:
        """How a plain connection `worker` handed here goes back to it
        (front/giving_back.py): its descriptor over their link, this worker's
        closed. False, and nothing done, when the link is gone or closing."""
        def give_back(transport: asyncio.Transport) -> bool:
            link = self.links.get(worker)
            sock = transport.get_extra_info("socket")
            if self.closing or link is None or link.closed or sock is None:
                return False
            transport.pause_reading()
            link.send(Back(), b"", fds=(os.dup(sock.fileno()),))
            transport.close()  # this worker's descriptor only: the connection lives on in the follower
            self._gave_back()
            return True

        return give_back

    def _left(self, worker: int, link: Channel) -> None:
        self.follower_links.left(worker, link)
        if self.desk is not None:
            self.desk.gone(worker)
        partial = self._partial.pop(worker, None)
        if partial is not None:
            os.close(partial[0])

    # -- a follower's link -------------------------------------------------------
    def _from_follower(self, worker: int, message: Message | Unknown, tail: bytes, fds: list[int]) -> None:
        if isinstance(message, Conn) and len(fds) == 1:
            stale = self._partial.pop(worker, None)
            if stale is not None:
                os.close(stale[0])
            self._handed()
            if message.more:
                self._partial[worker] = (fds[0], bytearray(tail), message.eof, message.secure, message.more)
            else:
                self._adopt(fds[0], tail, message.eof, secure=message.secure, give_back=self._back_to(worker))
            return
        for fd in fds:
            os.close(fd)
        match message:
            case More() if worker in self._partial:
                fd, data, eof, secure, left = self._partial.pop(worker)
                data += tail
                if left > 1:
                    self._partial[worker] = (fd, data, eof, secure, left - 1)
                else:
                    self._adopt(fd, bytes(data), eof, secure=secure, give_back=self._back_to(worker))
            case Hits(hits=hits):
                for host, key, slot, hot, sent, first_byte in hits:
                    self.store.touch(slot)
                    self._count_hit(host, key, bool(hot), int(sent), first_byte)
            case Lead(n=n, key=key, host=host, path=path):
                ok = self.desk.asked(worker, int(n), str(key), str(host), str(path)) if self.desk is not None else False
                if ok is not None:  # None: held, answered by the desk once the origin is known
                    self.follower_links.send(worker, Granted(n=n, ok=ok))
            case LeadDone(key=key, meta=meta, seconds=seconds, large=large):
                if self.desk is not None:
                    self.desk.done(worker, str(key), meta, float(seconds), large=bool(large))
            case Missed(misses=misses):
                for host, sent, first_byte in misses:
                    self._count_miss(host, int(sent), first_byte)
            case TlsOutcome(outcome=outcome):
                self._tls_outcome(str(outcome))
            case Fallback(reason=reason):
                self._tls_fallback(str(reason))
            case Flushed(n=n):
                self.follower_links.flushed(worker, n)
            case Ready():
                if self.control is not None:
                    self.control.send(Ready(worker=worker))
            case _:
                log.error("worker_record_unknown", record=_tag(message), worker=worker)


def _tag(message: Message | Unknown) -> str:
    return message.tag if isinstance(message, Unknown) else message.TAG


class Primary:
    """What `cachenode.app.serve` is given to run as the primary: `counted`,
    for the node's /metrics (passed to the node when it is built), and
    `attach`, called once the node serves: its links started and the
    supervisor told; it returns what closes them."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.follower_links = FollowerLinks()
        self.counted = self.follower_links.counted

    def attach(self, node, listener) -> Callable[[], None]:
        metrics = node.metrics
        desk = LeadDesk(node, send=self.follower_links.send,
                        outcome=lambda outcome: metrics.worker_leads.labels(outcome).inc())
        followers = Followers(control=self.control, store=node.store, follower_links=self.follower_links,
                              adopt=listener.adopt_handed, count_hit=node.handler.count_fast_hit,
                              handed=metrics.worker_handovers.inc, gave_back=metrics.worker_givebacks.inc,
                              tls_outcome=lambda outcome: metrics.tls_connections.labels(outcome).inc(),
                              tls_fallback=lambda reason: metrics.parent_fallbacks.labels(reason=reason).inc(),
                              desk=desk, count_miss=node.counts.plain_miss)
        followers.start()
        node.supervisor = os.getppid()  # /readyz names it: the node's process, to whoever started it
        followers.ready()
        return followers.close
