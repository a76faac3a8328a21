"""A follower worker: plain hits from the node's disk, everything else handed
to the primary (docs/cache-node.md, "Workers"; cachenode/workers/primary.py).

It listens on the node's port beside the primary (SO_REUSEPORT), keeps a
copy of the primary's store index from the records it sends, and answers
through the same fast path (cachenode/front/fastpath.py) what the fast path
answers. A request it does not answer goes, with the connection and the
bytes read of it, to the primary: it never evicts, relays or talks to
Redis, and fills nothing but the small cold misses the primary grants it
with `--follower-leads` (cachenode/workers/follower_leads.py), whose files
only the primary admits to the index.

Its copy of the index can be a moment behind. That is safe because the
data file an entry names is opened for each hit, and the primary unlinks a
removed object's file before it answers the write that removed it
(`Store.remove`): an entry the follower has not yet dropped finds no file,
and the request is handed to the primary, which serves what is current.

When its link to the primary breaks (the primary died), it stops listening,
lets the hits it is sending finish, and exits; the supervisor starts it
again, joined to the new primary with a fresh copy of the index.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import structlog

from cachenode.app import build_tls_port, hangup_stops, leaves_for, read_ca
from cachenode.fill.origin import via_of
from cachenode.front.connections import listen_backlog, node_gate, serve_handed
from cachenode.front.fastpath import FastPath
from cachenode.front.hits import PlainHitFinder
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.tls.port import TlsPort
from cachenode.workers import bridge
from cachenode.workers.channel import MAX_RECORD, Channel
from cachenode.workers.index_feed import meta_from
from cachenode.workers.follower_leads import FollowerLeads
from cachenode.workers.messages import (Back, Conn, Drop, Fallback, Flush, Flushed, Granted, Hits, Message, Missed, More,
                                        Put, Ready, Rows, Synced, TlsOutcome, Unknown)
from nezha.config import CacheSettings, parse_hostport
from nezha.errors import RunError
from nezha.lifecycle import stop_on_signals

log = structlog.get_logger("nezha.workers")

_FLUSH_SECONDS = 0.05
_FLUSH_HITS = 200


class _Hits:
    """The fast path's hits served on this worker (its finder answers the
    first question over this worker's copy of the index, cachenode/front/hits.py):
    each logged here, and queued for the primary to count."""

    def __init__(self, finder: PlainHitFinder, link: Channel) -> None:
        self._finder = finder
        self._link = link
        self._queued: list[list] = []
        self._missed: list[list] = []  # misses answered from this worker's leads (follower_leads.py)
        self._flush_at: asyncio.TimerHandle | None = None

    def fast_hit_done(self, meta: Meta, *, method: str, path: str, sent: int, ms: float,
                      gone: bool = False, first_byte: float | None = None, status: int = 200) -> None:
        self._finder.log_fast_hit(meta, method=method, path=path, sent=sent, ms=ms, gone=gone, status=status)
        self._queued.append([meta.host, meta.key, meta.slot, meta.hot, sent, first_byte])
        self._soon(len(self._queued))

    def missed(self, host: str, sent: int, first_byte: float | None) -> None:
        self._missed.append([host, sent, first_byte])
        self._soon(len(self._missed))

    def _soon(self, queued: int) -> None:
        if queued >= _FLUSH_HITS:
            self.flush()
        elif self._flush_at is None:
            self._flush_at = asyncio.get_running_loop().call_later(_FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        while self._queued:
            batch, self._queued = self._queued[:_FLUSH_HITS], self._queued[_FLUSH_HITS:]
            self._link.send(Hits(hits=batch))
        while self._missed:
            batch, self._missed = self._missed[:_FLUSH_HITS], self._missed[_FLUSH_HITS:]
            self._link.send(Missed(misses=batch))


class Follower:
    def __init__(self, settings: CacheSettings, *, link: socket.socket, worker: int, open_files: int) -> None:
        self.settings = settings
        self.worker = worker
        # Only what a plain hit needs: a store that is never opened (its index
        # mirrors the primary's records; it fills, writes and evicts nothing)
        # and the questions the fast path asks of it. No node is built.
        self.store = Store(settings.data_dir, capacity=settings.capacity, hot_capacity=settings.hot_capacity,
                           small_max=settings.small_object_max, verify_reads=settings.verify_reads,
                           writer=False)
        self.metrics = Metrics()
        self.finder = PlainHitFinder(table=settings.origin_table, store=self.store, via=via_of(settings.identity),
                                     node_id=settings.identity)
        self._link_sock = link
        self.link: Channel | None = None
        self.synced = asyncio.Event()
        self.lost = asyncio.Event()
        self.gate = node_gate(settings.max_connections, open_files, metrics=self.metrics)
        self.backlog = listen_backlog(open_files)
        self.server: asyncio.AbstractServer | None = None
        self.tls: TlsPort | None = None
        self.hits: _Hits | None = None
        # Its own leads of small cold fills (follower_leads.py, `follower_leads`), on its own origin pool.
        self.leads = FollowerLeads(settings, store=self.store, via=via_of(settings.identity), send=self._send,
                                   missed=self._missed) if settings.follower_leads else None
        self._bridges: set[asyncio.Future] = set()
        self._taken_back: set[asyncio.Task] = set()

    def _send(self, message: Message) -> bool:
        if self.link is None or self.link.closed:
            return False
        self.link.send(message)
        return True

    def _missed(self, host: str, sent: int, first_byte: float | None) -> None:
        if self.hits is not None:
            self.hits.missed(host, sent, first_byte)

    def _record(self, message: Message | Unknown, tail: bytes, fds: list[int]) -> None:
        if isinstance(message, Back) and len(fds) == 1:
            self._take_back(fds[0])
            return
        for fd in fds:
            os.close(fd)
        match message:
            case Rows(n=n):
                try:
                    self.store.index.add_rows(n, tail)
                except ValueError as e:  # the next change of each of its objects still comes
                    log.error("worker_record_malformed", error=str(e), worker=self.worker)
            case Put() | Drop():
                for raw in message.metas:
                    self.store.mirror(message.TAG, meta_from(raw))
            case Granted(n=n, ok=ok):
                if self.leads is not None:
                    self.leads.granted(n, bool(ok))
            case Synced():
                self.synced.set()
            case Flush(n=n):
                # Every hit answered so far goes before the answer, on the same ordered link.
                if self.hits is not None:
                    self.hits.flush()
                if self.link is not None:
                    self.link.send(Flushed(n=n))
            case _:
                tag = message.tag if isinstance(message, Unknown) else message.TAG
                log.error("worker_record_unknown", record=tag, worker=self.worker)

    def _take_back(self, fd: int) -> None:
        """A connection this worker handed to the primary, given back at a clean
        request boundary (front/giving_back.py): served here again, as if
        accepted here; handed over again at its next miss. Closed if this
        worker no longer serves (it stops, or does not listen yet)."""
        if len(self.gate.open) >= self.gate.limit and self.link is not None and not self.link.closed:
            self.link.send(Conn(), b"", fds=(fd,))  # no room here: the primary keeps it rather than a 503
            return
        sock = socket.socket(fileno=fd)
        if self.server is None or not self.server.is_serving():
            sock.close()
            return
        serve_handed(sock, lambda: self._connection(self.hand_over), self._taken_back,
                     lost="given_back_connection_lost", worker=self.worker)

    def _lost(self) -> None:
        if self.leads is not None:
            self.leads.lost()
        self.lost.set()

    def hand_over(self, transport: asyncio.Transport, received: bytes, eof: bool) -> None:
        """Give a connection this worker will not serve to the primary: once the
        answers already written have left (so nothing the primary writes can
        overtake them), its descriptor and the bytes read of it."""
        transport.pause_reading()
        loop = asyncio.get_running_loop()

        def send() -> None:
            if transport.is_closing():
                return
            if transport.get_write_buffer_size():
                loop.call_later(0.002, send)
                return
            link = self.link
            sock = transport.get_extra_info("socket")
            if link is None or link.closed or sock is None:
                transport.close()
                return
            fd = os.dup(sock.fileno())
            first, rest = received[:MAX_RECORD], received[MAX_RECORD:]
            parts = [rest[i:i + MAX_RECORD] for i in range(0, len(rest), MAX_RECORD)]
            link.send(Conn(eof=eof, more=len(parts)), first, fds=(fd,))
            for part in parts:
                link.send(More(), part)
            transport.close()  # this worker's descriptor only: the connection lives on in the primary

        send()

    def _connection(self, hand_over) -> FastPath:
        """A client connection on this worker: the fast path, with what it does
        not answer handed to the primary by `hand_over`."""
        return FastPath(finder=self.finder, served=self.hits, aiohttp_protocol=None, gate=self.gate,
                        head_timeout=self.settings.request_head_timeout, hand_over=hand_over,
                        misses=self.leads)  # a TLS connection's requests are https: never led here

    async def run(self, stop: asyncio.Event) -> None:
        self.link = Channel(self._link_sock, on_record=self._record, on_closed=self._lost)
        self.hits = _Hits(self.finder, self.link)
        waiting = asyncio.ensure_future(self.synced.wait())
        gone = asyncio.ensure_future(self.lost.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiting, gone, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not self.synced.is_set():
            for f in (waiting, gone, stopping):
                f.cancel()
            return
        if self.leads is not None:
            await self.leads.origins.start()
        host, port = self.settings.listen_addr
        loop = asyncio.get_running_loop()
        try:
            self.server = await loop.create_server(
                lambda: self._connection(self.hand_over), host, port, reuse_address=True, reuse_port=True, backlog=self.backlog)
        except OSError as e:
            raise RunError(f"worker {self.worker}: cannot listen on {self.settings.listen} (--listen): "
                           f"{e.strerror or e}") from e
        if self.settings.tls_listen is not None:
            await self._start_tls()
        self.link.send(Ready())
        log.info("worker_listening", worker=self.worker, listen=self.settings.listen, objects=len(self.store))
        await asyncio.wait([gone, stopping], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        reason = "stopping" if stop.is_set() else "primary gone"
        log.info("worker_stopping", worker=self.worker, reason=reason)
        await self.drain()
        gone.cancel()
        stopping.cancel()

    async def _start_tls(self) -> None:
        """The TLS port, on the node's port beside the other workers': the
        handshakes it makes are this worker's CPU. Passed-through connections
        are relayed from here; terminated ones are bridged to the primary."""
        def tell(message):
            return lambda value: self.link.send(message(value)) if self.link is not None else None

        self.tls = build_tls_port(self.settings, leaves_for(self.settings, read_ca(self.settings)),
                                  on_outcome=tell(TlsOutcome), on_fallback=tell(Fallback),
                                  adopt=self.adopt_tls, backlog=self.backlog, gate=self.gate)
        host, port = parse_hostport(self.settings.tls_listen, field="tls_listen")
        try:
            await self.tls.start(host, port, reuse_port=True)
        except OSError as e:
            raise RunError(f"worker {self.worker}: cannot listen on {self.settings.tls_listen} (--tls-listen): "
                           f"{e.strerror or e}") from e

    async def adopt_tls(self, sock: socket.socket, context) -> None:
        """Make the handshake here and serve the connection's plain hits here
        too (the fast path reads and writes through TLS); the first request it
        does not answer joins the client to the primary in the clear
        (`hand_over_tls`). Raises when the handshake fails, as the TLS port
        expects."""
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(
            lambda: self._connection(self.hand_over_tls), sock, ssl=context,
            ssl_handshake_timeout=self.settings.request_head_timeout)

    def hand_over_tls(self, transport: asyncio.Transport, received: bytes, eof: bool) -> None:
        """A TLS connection's state cannot go to the primary with its descriptor:
        the client's transport is joined (cachenode/workers/bridge.py) to one end
        of a fresh socketpair whose other end goes to the primary, where its
        requests are https. What was read and not answered goes first. Answers
        already written stay ahead of the primary's: one transport writes both."""
        link = self.link
        if link is None or link.closed:
            transport.close()
            return
        client, primary = bridge.pair()
        client.transport = transport
        transport.set_protocol(client)
        client.hold(received, eof)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        link.send(Conn(secure=True, eof=False, more=0), b"", fds=(theirs.detach(),))
        loop = asyncio.get_running_loop()

        async def join() -> None:
            try:
                await loop.connect_accepted_socket(lambda: primary, ours)
            except OSError:
                ours.close()
                transport.close()

        task = loop.create_task(join())
        self._bridges.add(task)
        task.add_done_callback(self._bridges.discard)

    async def drain(self, grace: float = 30.0) -> None:
        """Stop listening; close idle connections; let hits being sent finish."""
        if self.server is not None:
            self.server.close()
        if self.tls is not None:
            await self.tls.close()
        deadline = time.monotonic() + grace
        while True:
            busy = False
            for conn in list(self.gate.open):
                if isinstance(conn, FastPath) and conn.idle:
                    conn.close()
                else:
                    busy = True
            if not busy or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if self.hits is not None:
            self.hits.flush()
        if self.leads is not None:
            await self.leads.origins.close()
        # What is queued for the primary (counts, a connection) is sent if it can be.
        while self.link is not None and not self.link.closed and self.link.queued and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


async def serve_follower(settings: CacheSettings, *, link: socket.socket, worker: int, open_files: int) -> int:
    """Run one follower worker until SIGTERM or its primary is gone; the exit code."""
    follower = Follower(settings, link=link, worker=worker, open_files=open_files)
    stop = stop_on_signals(None, hangup=hangup_stops())
    await follower.run(stop)
    return 0 if stop.is_set() else 3
