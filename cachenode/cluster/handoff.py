"""Copying objects between nodes: replicas after a fill, and hand-off on a ring change.

Copies always come from a peer's disk (`Cache-Control: only-if-cached`),
never from the origin: a replica that cannot be copied is simply missing,
and the next miss fills it the usual way.

Internal endpoints (reachable only with a Host that names no origin):

    POST /_nezha/replicate  {"scheme"?, "host", "path", "source", "address"?, "headers"?}
                            copy one object from `source`; `headers`, the request
                            fields that select one variant of a response that varies
                            answers at once and streams JSON lines: {"copying": bytes}
                            every second while the copy runs, then {"result", "bytes"}
    POST /_nezha/handoff    {"nodes": {id: addr}, "weights": {...}?}
                            copy every object held here to its owners under that ring
    GET  /_nezha/handoff    progress of the last hand-off

A copy takes as long as the object takes to cross the network, which for a
dataset can be minutes. The replicate call therefore proves it is alive with
a line a second instead of answering at the end (the asking side is
cluster/replicas.py, whose caller gives up after `REPLICATE_SILENCE` without
a line, never because a copy is merely long).

A hand-off pushes its small objects to each new owner in batches
(cluster/replica_batches.py, received by cluster/replica_intake.py at
`POST /_nezha/replicas`), and asks for the others one by one.

A drain is a hand-off to the ring without this node: the controller (and
`LocalCluster.remove` for local clusters) runs it before removing a node,
and publishes the new ring only when no copy failed.

These endpoints make the node send requests to addresses named in the
request, so they are not for anyone who can reach the port: they need the
shared `cluster_token` in `X-Nezha-Token`, and with no token configured they
answer only to loopback clients (a local `nezha up`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Coroutine, Protocol

import aiohttp
import structlog
from aiohttp import web

from cachenode.cluster.replicas import Replicas
from cachenode.cluster_view import ClusterView
from nezha.chunks import chunk_of
from nezha.ring import Peer
from nezha.config import CacheSettings, Origin, parse_hostport
from cachenode.fill.buffer import Fill
from cachenode.fill.flights import Flight, Flights, Kind, Outcome, Source
from cachenode.fill.origin import OriginClient
from nezha.keys import BadTarget, Target, key_for, parse_target, target_of
from nezha.ring import Membership
from cachenode.peers.auth import peer_auth
from nezha.wire import (HANDOFF_PATH, PEER_HEADER, SCHEME_HEADER, ReplicateResult,
                        replicate_failed)
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.http.vary import selecting_headers


log = structlog.get_logger("nezha.handoff")


@dataclass
class Progress:
    state: str = "idle"  # idle | running | done
    epoch: int | None = None
    total: int = 0
    done: int = 0
    bytes: int = 0  # bytes copied to other nodes so far, counted as they arrive
    copied: int = 0
    present: int = 0
    skipped: int = 0  # stale objects, left for their new owners to revalidate
    failed: int = 0
    started: float = 0.0
    finished: float = 0.0
    errors: list[str] = field(default_factory=list)

    def add_bytes(self, n: int) -> None:
        self.bytes += n

    def tally(self, key: str, results: list[str]) -> None:
        """Count what each owner answered when asked to copy `key`; only the
        first 20 failures are kept by name, so a hand-off of a whole store
        that fails everywhere still reports in one small answer."""
        for r in results:
            if r == ReplicateResult.COPIED:
                self.copied += 1
            elif r == ReplicateResult.PRESENT:
                self.present += 1
            else:
                self.failed += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{key}: {r}")


_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
HEARTBEAT = 1.0  # seconds between progress lines of a replicate call
WINDOW = 1024  # objects a hand-off has on their way at once (cluster/replica_batches.py gathers 64 a request)


class _Copy:
    """How far one copy has got: the fill that writes it, once there is one."""

    fill: Fill | None = None

    @property
    def bytes(self) -> int:
        return self.fill.written if self.fill is not None else 0


def _line(message: dict) -> bytes:
    return json.dumps(message).encode() + b"\n"


class Lead(Protocol):
    """How a copy is fetched: as the leader of the key's flight (`CacheNode.lead`)."""

    async def __call__(self, flight: Flight, *, key: str, url: str, origin: Origin, stale: Meta | None,
                       target: Target, source: Source) -> tuple[Outcome, aiohttp.ClientResponse | None]: ...


class ChunkHandOff(Protocol):
    """How one chunk is handed to its owners under a ring (cachenode/chunks/copies.py `ChunkCopies`)."""

    async def hand_off(self, meta: Meta, view: ClusterView) -> list[str]:
        """One ReplicateResult an owner."""


class Handoff:
    """Copies between nodes. Given the parts it uses, not the node: the view
    of the ring, the store it reads, the flights a copy joins, the client it
    asks peers with, how to lead a fetch and how to run background work."""

    def __init__(self, *, node_id: str, settings: CacheSettings, cluster: ClusterView, store: Store,
                 flights: Flights, client: OriginClient, lead: Lead, replicas: Replicas, chunks: ChunkHandOff,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task], parallel: int = 4) -> None:
        self.node_id = node_id
        self.settings = settings
        self.cluster = cluster
        self.store = store
        self.flights = flights
        self.client = client
        self.lead = lead
        self.replicas = replicas  # asks the new owners to copy each object from here
        self.chunks = chunks  # hands a chunk to the owners of its own key (cachenode/chunks/copies.py)
        self.spawn = spawn
        self.parallel = parallel
        self.progress = Progress()
        self._running: asyncio.Task | None = None

    # -- HTTP (routed by cachenode/front/routes.py, which refuses a request without the token) --
    async def progress_endpoint(self, request: web.Request) -> web.Response:
        """GET /_nezha/handoff: how far the hand-off has got."""
        return web.json_response(asdict(self.progress))

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as e:
            raise web.HTTPBadRequest(text=f"body is not JSON: {e}\n")
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="body must be a JSON object\n")
        return body

    async def replicate_endpoint(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        host, path, source = body.get("host"), body.get("path"), body.get("source")
        scheme = body.get("scheme", "http")  # absent from a node that predates https keys
        if scheme not in ("http", "https"):
            raise web.HTTPBadRequest(text=f"replicate scheme {scheme!r} is neither http nor https\n")
        if not all(isinstance(v, str) for v in (host, path, source)):
            raise web.HTTPBadRequest(text="replicate wants string fields host, path and source\n")
        peer = self.cluster.peer(source)
        address = body.get("address")
        if peer is None and isinstance(address, str):
            # A node the ring no longer has, handing off before it exits (a
            # scale-down): it says where it is. The cluster token vouches for it.
            try:
                parse_hostport(address, field="address")
            except ValueError as e:
                raise web.HTTPBadRequest(text=f"{e}\n")
            peer = Peer(source, address)
        if peer is None:
            raise web.HTTPBadRequest(text=f"source {source!r} is not a member of the ring and gave no address\n")
        try:
            target = parse_target(path, host, scheme=scheme)
        except BadTarget as e:
            raise web.HTTPBadRequest(text=f"bad target: {e}\n")
        if target.host not in self.settings.origin_table:
            raise web.HTTPForbidden(text=f"host {target.host!r} is not a configured origin\n")
        selecting = body.get("headers") or {}
        if not isinstance(selecting, dict) or len(selecting) > 32 or not all(
                isinstance(k, str) and isinstance(v, str) and _FIELD_NAME.fullmatch(k) and "\n" not in v
                and "\r" not in v for k, v in selecting.items()):
            raise web.HTTPBadRequest(text="replicate headers must be an object of at most 32 request fields\n")
        copy = _Copy()
        # `hot`: a hot copy of an object this node does not own (the controller's
        # `nezha.io/prefetch-spread: all`), held within the hot share, evicted first.
        hot = body.get("hot") is True
        # The copy runs on its own: a caller that hangs up does not stop it.
        task = self.spawn(self.copy_from(peer, target, copy=copy, headers=selecting, hot=hot))
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=HEARTBEAT)
                if not task.done():
                    await resp.write(_line({"copying": copy.bytes}))
            if task.cancelled():
                result = replicate_failed(f"{self.node_id} is stopping")
            elif task.exception() is not None:
                result = replicate_failed(f"{type(task.exception()).__name__}: {task.exception()}")
            else:
                result = task.result()
            await resp.write(_line({"result": result, "bytes": copy.bytes}))
            await resp.write_eof()
        except ConnectionResetError:
            log.info("replicate_caller_gone", source=source, path=target.path, bytes=copy.bytes)
        return resp

    async def handoff_endpoint(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        nodes = body.get("nodes")
        if not isinstance(nodes, dict) or not nodes or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in nodes.items()):
            raise web.HTTPBadRequest(text="handoff wants nodes: a non-empty {id: host:port} object\n")
        weights = body.get("weights") or {}
        if self._running is not None and not self._running.done():
            raise web.HTTPConflict(text=f"a hand-off is already running; GET {HANDOFF_PATH} for progress\n")
        view = ClusterView(node_id=self.node_id, replicas=self.cluster.replicas)
        view.update(Membership(epoch=body.get("epoch"), nodes=nodes, weights=weights))
        self._running = self.spawn(self.run(view))
        return web.json_response(asdict(self.progress), status=202)

    # -- work --------------------------------------------------------------------
    async def copy_from(self, peer: Peer, target: Target, *, copy: _Copy | None = None,
                        headers: dict[str, str] | None = None, hot: bool = False) -> str:
        """Make this node hold `target`'s object, copied from `peer`'s disk;
        for a response that varies, the variant `headers` select. `hot`: as
        a hot copy (`Meta.hot`) of an object this node does not own; a
        replica's copy replaces a hot copy held, so that it counts as held.

        Returns a ReplicateResult, or replicate_failed(why); `copy` follows its bytes.
        """
        origin = self.settings.origin_table[target.host]
        key = key_for(target, origin)
        selecting = headers or {}
        for _ in range(5):
            meta = self.store.lookup(key, selecting)
            if meta is not None and meta.fresh(time.time()) and (hot or not meta.hot):
                return ReplicateResult.PRESENT
            flight, leader = self.flights.lead_or_join(key)
            if leader:
                source = _peer_source(self.node_id, self.settings.cluster_token, peer, target, selecting, hot=hot)
                url = origin.url_of(target)
                outcome, response = await self.lead(flight, key=key, url=url, origin=origin, stale=None,
                                                    target=target, source=source)
                if response is not None:
                    response.release()
                break
            outcome = await asyncio.shield(flight.outcome)
            if outcome.answers(selecting):
                break
            await flight.landed.wait()  # a fetch of another variant of the key: copy this one after it
        else:
            return replicate_failed(f"{key} kept being fetched for other variants")
        if outcome.kind is Kind.STREAMING and outcome.fill is not None:
            if copy is not None:
                copy.fill = outcome.fill
            try:
                await outcome.fill.wait_finished()
            except Exception as e:
                return replicate_failed(e)
            return ReplicateResult.COPIED
        if outcome.kind is Kind.REVALIDATED:
            return ReplicateResult.PRESENT
        if outcome.kind is Kind.STORED and outcome.body is not None:
            return ReplicateResult.PRESENT  # a client's fill stored it at once meanwhile (fill/running.py)
        return replicate_failed(outcome.error or outcome.kind.value)

    def copy_soon(self, peer: Peer, target: Target) -> None:
        """Copy `target`'s object from `peer` in the background (a replica that
        found it missing); a failure only leaves the replica missing."""
        async def copy() -> None:
            result = await self.copy_from(peer, target)
            log.info("replica_kept", source=peer.id, path=target.path, result=result)

        self.spawn(copy())

    def copy_hot_soon(self, peer: Peer, target: Target, *, done: Callable[[], None],
                      headers: dict[str, str] | None = None) -> None:
        """Keep a hot copy of `target`'s object, copied from the owner `peer`
        in the background (of a response that varies, the variant `headers`
        select); `done()` when the copy ended, however it ended."""
        async def copy() -> None:
            try:
                result = await self.copy_from(peer, target, headers=headers, hot=True)
                log.info("hot_copy_kept", source=peer.id, path=target.path, result=result)
            finally:
                done()

        self.spawn(copy())

    async def run(self, view: ClusterView) -> Progress:
        """Copy every object held here to each of its owners under `view`'s ring.

        A store holds a million objects: their records are read a slice at a
        time in the executor as the walk goes (`Store.each_meta`), hot copies
        passed over unread, and at most `WINDOW` objects are on their way at
        once (a small one waiting in its batch, a large one at the gate of
        `parallel` copies), so neither a million tasks nor a million records
        are ever held."""
        self.progress = p = Progress(state="running", epoch=view.snapshot.epoch, total=self.store.count(hot=False),
                                     started=time.time())
        log.info("handoff_started", objects=p.total, nodes=sorted(view.snapshot.nodes))
        window = asyncio.Semaphore(WINDOW)
        gate = asyncio.Semaphore(self.parallel)
        running: set[asyncio.Task] = set()

        def finished(task: asyncio.Task, *, key: str) -> None:
            running.discard(task)
            window.release()
            p.done += 1
            if not task.cancelled() and (e := task.exception()) is not None:
                p.tally(key, [replicate_failed(f"{type(e).__name__}: {e}")])

        try:
            # Every variant is an object of its own; hot copies are no one's to hand on.
            async for meta in self.store.each_meta(hot=False):
                await window.acquire()
                work = self._hand_on(meta, view, p, gate)
                if work is None:
                    window.release()
                    p.done += 1
                    continue
                task = asyncio.ensure_future(work)
                running.add(task)
                task.add_done_callback(functools.partial(finished, key=meta.key))
            while running:
                await asyncio.wait(set(running))
        finally:
            for task in running:
                task.cancel()
        p.state = "done"
        p.finished = time.time()
        log.info("handoff_finished", objects=p.total, copied=p.copied, present=p.present, skipped=p.skipped,
                 failed=p.failed, bytes=p.bytes, seconds=round(p.finished - p.started, 3))
        return p

    def _hand_on(self, meta: Meta, view: ClusterView, p: Progress,
                 gate: asyncio.Semaphore) -> Coroutine[Any, Any, None] | None:
        """What handing `meta` on to its owners under `view` takes; None when
        that is decided here: no owner but this node, stale, a variant that
        cannot be asked for."""
        key = meta.key
        if meta.hot:
            return None  # a cache of the cache: its owners hold the object, and it is never handed off
        if chunk_of(key) is not None:
            return self._gated(gate, self._hand_off_chunk(meta, view, p))
        selecting = selecting_headers(meta.vary, meta.variant)
        if selecting is None:
            p.tally(key, [replicate_failed("its variant cannot be spelled as request fields")])
            return None
        if not meta.fresh(time.time()):
            # Copies are made only of fresh objects (only-if-cached); a stale one is
            # refetched or revalidated by its new owner at the next miss, so it is no failed copy.
            p.skipped += 1
            return None
        peers = [peer for peer in view.owners(key) if peer.id != self.node_id]
        if not peers:
            return None
        if self.replicas.batches.takes(meta):
            # A small object waits in its batch, not at the gate: the gate would let
            # no more than `parallel` of them into a batch (cluster/replica_batches.py).
            return self._in_batches(meta, target_of(key), selecting, peers, p)
        return self._gated(gate, self._one_by_one(meta, target_of(key), selecting, peers, p))

    @staticmethod
    async def _gated(gate: asyncio.Semaphore, work: Coroutine[Any, Any, None]) -> None:
        async with gate:
            await work

    async def _one_by_one(self, meta: Meta, target: Target, selecting: dict[str, str], peers: list[Peer],
                          p: Progress) -> None:
        """A large object: each owner asked to copy it from here, one after another."""
        if self.store.index.get(meta.slot) is None:
            return  # evicted since the walk read it
        results = [await self.replicas.ask_to_copy(peer, target, on_bytes=p.add_bytes, headers=selecting)
                   for peer in peers]
        p.tally(meta.key, results)

    async def _in_batches(self, meta: Meta, target: Target, selecting: dict[str, str], peers: list[Peer],
                          p: Progress) -> None:
        """A small object handed on with others bound for the same owner
        (cluster/replica_batches.py), its results tallied, an owner each. An
        object evicted or replaced before its batch left is no failure: it is gone."""
        results = []
        for result in await asyncio.gather(*(self.replicas.batches.add(peer, meta, target, selecting)
                                             for peer in peers)):
            if result is None:
                continue
            if result == ReplicateResult.COPIED:
                p.bytes += meta.size
            results.append(result)
        p.tally(meta.key, results)

    async def _hand_off_chunk(self, meta: Meta, view: ClusterView, p: Progress) -> None:
        """A chunk goes to the owners of its own key (nezha/chunks.py `place`),
        which copy it from here; its manifest is handed off like any object."""
        results = await self.chunks.hand_off(meta, view)
        if not results:
            p.skipped += 1
        for r in results:
            if r == ReplicateResult.COPIED:
                p.copied += 1
                p.bytes += meta.size
            else:
                p.failed += 1
                if len(p.errors) < 20:
                    p.errors.append(f"{meta.key}: {r}")



def _peer_source(node_id: str, cluster_token: str | None, peer: Peer, target: Target,
                 selecting: dict[str, str], *, hot: bool = False) -> Source:
    return Source(url=peer.url + target.path_qs, what=f"peer {peer.id} ({peer.address})", peer=peer, hot=hot,
                  headers={**selecting, "Host": target.host, PEER_HEADER: node_id, SCHEME_HEADER: target.scheme,
                           "Cache-Control": "only-if-cached", **peer_auth(cluster_token)})
