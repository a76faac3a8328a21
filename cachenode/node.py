"""CacheNode: one node's rooms wired together, and its lifecycle (start,
stop, background work, leaving the ring on SIGTERM).

Each request is the handler's (`front/handler.py`); fills are the fill
engine's (`fill/engine.py`); copies between nodes are hand-off's and
invalidation's (`cluster/`); counting is `counts.py`'s. They hold one
another, never the node: what they need is passed to them here.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Awaitable, Callable

import structlog

from cachenode.chunks.adopted import AdoptedChunks
from cachenode.chunks.copies import ChunkCopies
from cachenode.chunks.fills import ChunkFills
from cachenode.chunks.owner import ChunkOwner
from cachenode.chunks.peers import ChunkPeers
from cachenode.chunks.reads import ChunkReads
from cachenode.cluster.handoff import Handoff
from cachenode.cluster.invalidation import Broadcast, Invalidation
from cachenode.peers.auth import is_peer_request
from cachenode.cluster.pinning import Pinning
from cachenode.cluster.replicas import Replicas
from cachenode.cluster_view import ClusterView
from cachenode.counts import Counts
from cachenode.fill.engine import FillEngine
from cachenode.fill.flights import Flights
from cachenode.fill.origin import OriginClient, via_of
from cachenode.fill.recent_fills import RecentFills
from cachenode.fill.small_gets import SmallGets
from cachenode.fill.upstream import Upstream
from cachenode.fill.verify import Digests
from cachenode.cluster.hot_copies import HotCopies
from cachenode.cluster.replica_intake import ReplicaIntake
from cachenode.cluster.streaming_copies import StreamingCopies
from cachenode.front.pacing import Pacing
from cachenode.front.prefetch_fills import PrefetchFills
from cachenode.front.stored_checks import StoredChecks
from cachenode.front.admin import Admin
from cachenode.front.authorized import AuthorizedReads
from cachenode.front.forward import Forwarding
from cachenode.front.handler import Handler
from cachenode.front.fast_misses import FastMisses
from cachenode.front.hits import PlainHitFinder
from cachenode.front.reads import Reads
from cachenode.front.relaying import RelayedReads
from cachenode.front.routes import Routes, route_table
from cachenode.front.relay import PeerRelay
from cachenode.front.respond import Responder
from cachenode.kernel.sendfile import FileSender
from cachenode.metrics import Metrics
from cachenode.store.report import StoreReport
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.store.scrub import Scrub
from cachenode.tasks import Tasks
from nezha.config import CacheSettings
from nezha.ring import Peer
from nezha.wire import DrainOutcome

log = structlog.get_logger("nezha.cachenode")


class CacheNode:
    def __init__(self, *, settings: CacheSettings, store: Store, origins: OriginClient,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.time,
                 cluster: ClusterView | None = None, index=None,
                 before_metrics: Callable[[], Awaitable[None]] | None = None) -> None:
        self.settings = settings
        self.store = store
        self.origins = origins
        self.metrics = metrics or Metrics()
        self.node_id = settings.identity
        self.cluster = cluster or ClusterView(node_id=self.node_id, replicas=settings.replicas)
        self.index = index  # nezha.index.Index or None: stats and locations, never awaited on the hot path
        self.tasks = Tasks()  # background work, handed down as `spawn` (cachenode/tasks.py)
        self._scrub: asyncio.Task | None = None  # the background scrub (cachenode/store/scrub.py)
        self._ready = False
        self.supervisor: int | None = None  # with --workers: the pid of the process that started this one
        self.metrics.registry.register(StoreReport(store.index))
        self._counting(settings, index)
        self._links(settings)
        self._rooms(settings, clock)
        self.handler = self._front(settings, before_metrics=before_metrics, clock=clock)

    def _counting(self, settings: CacheSettings, index) -> None:
        """Pacing and counts first: every room below counts through them."""
        token = settings.cluster_token
        self.counts = Counts(metrics=self.metrics, index=index,
                             from_peer=lambda request: is_peer_request(request, token))
        # Prefetch fills wait while live requests come in (cachenode/front/pacing.py); fast hits
        # count as live: the pacing reads when Counts last saw one.
        self.pacing = Pacing(busy=settings.prefetch_busy_fills, idle=settings.prefetch_idle_fills,
                             quiet=settings.prefetch_quiet, hits=self.counts.live)
        if index is not None and index.enabled:
            self.metrics.watch_index(lambda: index.conn.state == "ok")

    def _links(self, settings: CacheSettings) -> None:
        """The node's two ways out over its one origin client: to peers directly
        (the relay), to origins through the parent tier when there is one."""
        # A cold owner sends its headers once the origin sent its own: within
        # the origin's connect and read timeouts; a frozen one is found sooner,
        # by probing it (the rules are in cachenode/front/relay.py).
        # The digests fills check (fill/verify.py): the relay notes there the Hugging
        # Face redirects it passes on, and hands the digest they name to the target's owner.
        self.digests = Digests(mismatches=self.metrics.digest_mismatches,
                               origins=[o.host for o in settings.origins if not o.wildcard])
        self.relay = PeerRelay(
            node_id=self.node_id, client=self.origins, peer_timeout=settings.peer_timeout,
            header_timeout=settings.origin_connect_timeout + settings.origin_read_timeout + settings.peer_timeout,
            read_timeout=settings.origin_read_timeout + settings.peer_timeout, read_size=settings.read_size,
            cluster_token=settings.cluster_token, mismatches=self.metrics.digest_mismatches, linked=self.digests)
        # Requests for origins go to the parent tier first when there is one
        # (a sidecar's cluster); peers are always asked directly.
        self.upstream = Upstream(self.origins, metrics=self.metrics, parent=settings.parent,
                                 connect_timeout=settings.origin_connect_timeout,
                                 read_timeout=settings.origin_connect_timeout + settings.origin_read_timeout
                                 + settings.peer_timeout)
        # Cold small fills of plain http:// origins asked on the node's own connections (fill/small_gets.py).
        self.small_gets = SmallGets(connect_timeout=settings.origin_connect_timeout) if settings.small_gets else None

    def _rooms(self, settings: CacheSettings, clock: Callable[[], float]) -> None:
        """The rooms below the front: replication, chunks, the fill engine,
        hand-off, invalidation and the response writers."""
        # Built in the order they use one another, each given what it uses: every
        # collaborator is passed to the constructor that needs it (nothing is set on
        # an object after it is built; tests/unit/cachenode/test_no_wiring_after_construction.py).
        # Where a room below calls one above, it is handed a protocol.
        via = via_of(self.node_id)
        files = FileSender(sendfile=settings.sendfile, read_size=settings.read_size)
        # Asking peers to copy from here needs no engine: the engine is handed it.
        self.replicas = Replicas(node_id=self.node_id, settings=settings, cluster=self.cluster, store=self.store,
                                 client=self.origins, spawn=self.tasks.spawn)
        broadcast = Broadcast(node_id=self.node_id, settings=settings, cluster=self.cluster, client=self.origins)
        # Chunked objects (cachenode/chunks/): read from their chunks' owners by
        # whichever node answers the client; a chunk's owner serves and fills it.
        chunk_peers = ChunkPeers(node_id=self.node_id, relay=self.relay)
        chunk_fills = ChunkFills(node_id=self.node_id, store=self.store, upstream=self.upstream, members=self.cluster,
                                 peers=chunk_peers, relay=self.relay, counts=self.counts, metrics=self.metrics,
                                 via=via, spawn=self.tasks.spawn, clock=clock)
        adopted = AdoptedChunks(node_id=self.node_id, fills=chunk_fills, store=self.store, members=self.cluster,
                                peers=chunk_peers, counts=self.counts, spawn=self.tasks.spawn)
        self.chunk_copies = ChunkCopies(me=Peer(self.node_id, settings.advertise or settings.listen),
                                        store=self.store, members=self.cluster, fills=chunk_fills, adopted=adopted,
                                        peers=chunk_peers,
                                        tell=broadcast, counts=self.counts, spawn=self.tasks.spawn)
        self.engine = FillEngine(settings=settings, store=self.store, origins=self.upstream, peers=self.relay,
                                 counts=self.counts, metrics=self.metrics, via=via, spawn=self.tasks.spawn,
                                 replicate=self.replicas.replicate_soon, chunks=self.chunk_copies, clock=clock,
                                 digests=self.digests)
        self.handoff = Handoff(node_id=self.node_id, settings=settings, cluster=self.cluster, store=self.store,
                               flights=self.engine.flights, client=self.origins, lead=self.engine.lead,
                               replicas=self.replicas, chunks=self.chunk_copies, spawn=self.tasks.spawn)
        self.invalidation = Invalidation(broadcast=broadcast, forget=self.engine.forget,
                                         old_chunks=self.chunk_copies)
        chunk_reads = ChunkReads(settings=settings, store=self.store, upstream=self.upstream, members=self.cluster,
                                 fills=chunk_fills, kept=adopted.kept, peers=chunk_peers, relay=self.relay, via=via,
                                 send_file=files, forget=self.invalidation, counts=self.counts, drop=self.chunk_copies,
                                 mismatches=self.metrics.digest_mismatches)
        self.chunk_owner = ChunkOwner(node_id=self.node_id, store=self.store, fills=chunk_fills, members=self.cluster,
                                      counts=self.counts, send_file=files)
        self.respond = Responder(settings=settings, store=self.store, upstream=self.upstream, files=files,
                                 chunk_body=chunk_reads, count=self.counts.count, clock=clock,
                                 owners=self.cluster.owners)

    def _front(self, settings: CacheSettings, *, before_metrics, clock) -> Handler:
        """The front's answerers, each given the rooms below it, and the handler that routes to them."""
        hot = HotCopies(settings=settings, store=self.store, cluster=self.cluster, handoff=self.handoff,
                        counts=self.counts, clock=clock)
        # A stampede's readers on this node share one stream from the owner, kept as its copy.
        streaming = StreamingCopies(settings=settings, store=self.store, cluster=self.cluster,
                                    flights=self.engine.flights, lead=self.engine.lead, owners=self.relay,
                                    origin=self.upstream.request, counts=self.counts, via=self.engine.via)
        admin = Admin(metrics=self.metrics, status=self.status, before_metrics=before_metrics)
        table = settings.origin_table
        intake = ReplicaIntake(settings=settings, store=self.store, flights=self.engine.flights, counts=self.counts)
        reads = Reads(store=self.store, engine=self.engine, respond=self.respond, counts=self.counts, clock=clock)
        prefetch = PrefetchFills(table=table, node_id=self.node_id, reads=reads, upstream=self.upstream,
                                 owners=self.cluster.owners, pacing=self.pacing, clock=clock)
        routes = Routes(table=route_table(admin=admin, handoff=self.handoff, invalidation=self.invalidation,
                                          pinning=Pinning(pins=self.store.pins), intake=intake,
                                          stored=StoredChecks(pacing=self.pacing, size_of=self.store.stored_size),
                                          prefetch=prefetch),
                        origin_table=table, cluster_token=settings.cluster_token)
        authorized = AuthorizedReads(store=self.store, upstream=self.upstream, reads=reads, respond=self.respond,
                                     counts=self.counts, from_peer=lambda r: is_peer_request(r, settings.cluster_token),
                                     node_id=self.node_id, peers_have_a_token=settings.cluster_token is not None)
        return Handler(settings=settings, upstream=self.upstream, cluster=self.cluster, routes=routes,
                       plain=PlainHitFinder(table=table, store=self.store, via=self.respond.via, node_id=self.node_id,
                                            clock=clock),
                       hot=hot, relayed=RelayedReads(node_id=self.node_id, relay=self.relay, respond=self.respond,
                                                     hot=hot, counts=self.counts, clock=clock,
                                                     streaming=streaming),
                       reads=reads, authorized=authorized,
                       forwarding=Forwarding(table=table, respond=self.respond, invalidation=self.invalidation),
                       respond=self.respond, chunk_owner=self.chunk_owner, counts=self.counts, clock=clock,
                       misses=FastMisses(store=self.store, engine=self.engine, upstream=self.upstream,
                                         cluster=self.cluster, node_id=self.node_id, via=self.respond.via,
                                         pacing=self.pacing, counts=self.counts, metrics=self.metrics,
                                         recent=RecentFills() if settings.follower_leads or self.small_gets
                                         else None, small_gets=self.small_gets))

    @property
    def flights(self) -> Flights:
        return self.engine.flights

    async def start(self) -> None:
        # Serves at once: the index loads in the background (cachenode/store/loading.py).
        await self.store.open(background=True)
        await self.origins.start()
        if self.index is not None:
            self.index.on_membership(self.cluster.update)
            await self.index.start()
            if self.index.membership is not None:
                self.cluster.update(self.index.membership)
        self.counts.store_sizes(self.store.sizes())
        if self.settings.scrub_interval > 0:
            # Its own task, not `tasks.spawn`: it never ends, and `settled()` waits for what `spawn` runs.
            scrub = Scrub(self.store, interval=self.settings.scrub_interval, rate=self.settings.scrub_rate)
            self._scrub = asyncio.get_running_loop().create_task(scrub.run())
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        if self._scrub is not None:
            self._scrub.cancel()
            await asyncio.gather(self._scrub, return_exceptions=True)
            self._scrub = None
        await self.tasks.cancel()
        if self.index is not None:
            await self.index.close()
        await self.origins.close()
        if self.small_gets is not None:
            self.small_gets.close()
        await self.store.close()  # the last group sync of small objects

    async def settled(self) -> None:
        """Wait for fills and other background work in progress to finish, or
        to park: an on-demand fill waiting for clients to ask for more of it
        (cachenode/fill/parallel.py) is at rest."""
        while busy := [t for t in self.tasks.running if not self.engine.at_rest(t)]:
            await asyncio.wait(busy, timeout=0.05)
        await self.store.idle()  # and the disk steps they left behind (unlinks)

    async def leave(self) -> str:
        """On SIGTERM: hand every object to its owners if the ring no longer has
        this node; exit at once if it does. What happened, for the log.

        Kubernetes does not say whether a termination is permanent. The
        controller does: a pod a scale-down removes (ordinal at or above the
        new replicas) is taken out of the ring and named in its `leaving`
        set, in one write; a restarted or evicted pod also leaves the ring
        while it terminates, but is not named, and comes back with its disk.
        The SIGTERM may arrive before that write, so the node waits up to
        `leave_settle` for it. Only a node named leaving hands off, bounded
        by `shutdown_grace`.
        """
        s = self.settings
        if self.index is None:
            return DrainOutcome.STANDALONE
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.shutdown_grace
        settle_seconds = min(s.leave_settle, s.shutdown_grace)
        settle = loop.time() + settle_seconds
        while self._in_ring() and not self._named_leaving() and loop.time() < settle:
            await asyncio.sleep(0.05)
        if not self._named_leaving() or not self.cluster.clustered:
            # in_ring: the wait for a ring without this node ended by its timer, of settle_seconds, the one
            # wait on the way out of a restart (why a pod kept in the ring takes that long to stop).
            log.info("node_leaving", reason="not leaving for good: a restart keeps its disk", handoff=False,
                     in_ring=self._in_ring(), settle_seconds=settle_seconds)
            return DrainOutcome.RESTART
        if len(self.store) == 0:
            log.info("node_leaving", reason="out of the ring, nothing stored", handoff=False)
            return DrainOutcome.EMPTY
        log.info("node_leaving", reason="out of the ring: handing objects off", handoff=True,
                 objects=len(self.store), seconds=round(deadline - loop.time(), 1))
        started = time.time()
        try:
            progress = await asyncio.wait_for(self.handoff.run(self.cluster), timeout=max(0.1, deadline - loop.time()))
            outcome = DrainOutcome.INCOMPLETE if progress.failed else DrainOutcome.HANDED_OFF
        except asyncio.TimeoutError:
            progress = self.handoff.progress
            log.error("handoff_unfinished", done=progress.done, total=progress.total, failed=progress.failed,
                      reason=f"shutdown_grace ({s.shutdown_grace:g}s) ran out")
            outcome = DrainOutcome.TIMED_OUT
        if progress.failed:
            log.error("handoff_incomplete", failed=progress.failed, total=progress.total, errors=progress.errors[:5])
        # For the controller's Events: it cannot ask a node that has exited.
        await self.index.record_drain({"outcome": outcome, "started": round(started, 3), "total": progress.total,
                                       "done": progress.done, "copied": progress.copied, "present": progress.present,
                                       "skipped": progress.skipped, "failed": progress.failed,
                                       "bytes": progress.bytes, "errors": progress.errors[:20]})
        return outcome

    def _in_ring(self) -> bool:
        return self.node_id in self.cluster.snapshot.nodes

    def _named_leaving(self) -> bool:
        return self.node_id in self.cluster.snapshot.leaving and not self._in_ring()

    def on_evict(self, meta: Meta) -> None:
        """The store evicted `meta` to make room."""
        self.counts.gone(meta, self.store.sizes(), evictions=1)

    def status(self) -> dict:
        snap = self.cluster.snapshot
        detail = {"ready": self._ready, "node": self.node_id, "pid": os.getpid(), "replicas": self.cluster.replicas,
                  "objects": len(self.store),
                  "bytes": self.store.used_bytes, "fills_in_flight": len(self.flights),
                  # replication, copies, fills run on after their first reader: what settled() waits for
                  "background_tasks": len(self.tasks.running),
                  "store_loaded": round(self.store.load_progress, 4),
                  "ring_epoch": snap.epoch, "ring_nodes": sorted(snap.nodes)}
        if self.supervisor is not None:
            detail["supervisor"] = self.supervisor
        if self.index is not None:
            detail["index"] = self.index.status()
        return detail
