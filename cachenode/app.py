"""Wiring of one cache node: settings -> store, origin client, index, CacheNode -> listener
(`front/listener.py`) and the TLS port; `serve()` and its shutdown."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

import structlog
from aiohttp import web
from yarl import URL

from cachenode.front.connections import raise_open_files_limit
from cachenode.front.listener import Listener, build_admin_app
from cachenode.cluster_view import ClusterView
from cachenode.metrics import Metrics
from cachenode.fill.origin import OriginClient
from cachenode.node import CacheNode
from cachenode.store.disk import Store
from cachenode.store.report import StoreReport
from cachenode.tls.port import Relay, Terminate, TlsPort, passthrough_target
from nezha.config import HOST_PLACEHOLDER, CacheSettings, parse_hostport
from nezha.errors import RunError
from nezha.lifecycle import stop_on_signals
from nezha.logs import flush_repeats

if TYPE_CHECKING:
    # cryptography (about 50 ms of imports, more on a loaded machine) only for
    # a node given a CA: read_ca and leaves_for import it when they need it.
    from cachenode.tls.certificates import Leaves
    from cachenode.workers.primary import Primary  # a layer above: the type only
    from nezha.pki import Pair

log = structlog.get_logger("nezha.cachenode")


def hangup_stops() -> bool:
    """Does SIGHUP stop the node as SIGTERM does (drain, then exit 0)? Yes,
    unless it was started ignoring SIGHUP (`nohup`), which it then keeps
    ignoring. A closed terminal or `kill -HUP` to the process group used to
    end a node at once (exit 129), cutting every download in flight and
    leaving a partial file (docs/operations.md, "Signals")."""
    return signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN


def build_node(settings: CacheSettings, *, before_metrics: Callable[[], Awaitable[None]] | None = None) -> CacheNode:
    """One node, not yet started. `before_metrics`: awaited before /metrics
    renders (the primary's links to its followers, cachenode/workers/primary.py)."""
    metrics = Metrics()
    node: CacheNode | None = None

    def on_evict(meta):
        if node is not None:
            node.on_evict(meta)

    # Built before the store, which asks it whether an object it commits is an extra copy here.
    cluster = ClusterView(node_id=settings.identity, replicas=settings.replicas)
    store = Store(settings.data_dir, capacity=settings.capacity, on_evict=on_evict,
                  hot_capacity=settings.hot_capacity, pinned_capacity=settings.pinned_capacity,
                  extra=cluster.holds_as_extra, small_max=settings.small_object_max, sync_interval=settings.sync_interval,
                  on_corrupt=lambda found_by: metrics.corrupt_objects.labels(found_by=found_by).inc(),
                  verify_reads=settings.verify_reads)
    origins = OriginClient(connect_timeout=settings.origin_connect_timeout,
                           read_timeout=settings.origin_read_timeout, roots=origin_roots(settings))
    index = None
    if settings.redis_url is not None:
        from nezha.index.handle import Index

        index = Index(redis_url=settings.redis_url, node_id=settings.identity,
                      flush_interval=settings.stats_flush_interval, refresh_interval=settings.ring_refresh_interval,
                      report=StoreReport(store.index).fields)
    node = CacheNode(settings=settings, store=store, origins=origins, metrics=metrics, cluster=cluster, index=index,
                     before_metrics=before_metrics)
    return node


def origin_roots(settings: CacheSettings) -> dict[tuple[str, int], Path]:
    """Each origin's own CA bundle, by the https:// (host, port) its upstreams name."""
    roots: dict[tuple[str, int], Path] = {}
    for o in settings.origins:
        if o.ca_bundle is None:
            continue
        for scheme in ("http", "https"):
            upstream = o.upstream_for(scheme, HOST_PLACEHOLDER)  # a pattern's {host} stays in place
            u = URL(upstream.replace(HOST_PLACEHOLDER, "placeholder.invalid"))
            if u.scheme == "https" and u.host:
                # A *.domain origin fetching each name from itself: its bundle covers the whole domain.
                host = o.host if HOST_PLACEHOLDER in upstream else u.host
                roots[(host, u.port or 443)] = o.ca_bundle
    return roots


def read_ca(settings: CacheSettings) -> Pair | None:
    """The CA the node was given; ConfigError naming the flag when it cannot be used."""
    if settings.ca_cert is None or settings.ca_key is None:
        return None
    from cachenode.tls.certificates import load_ca

    return load_ca(settings.ca_cert, settings.ca_key)


def leaves_for(settings: CacheSettings, ca: Pair | None) -> Leaves | None:
    """The node's leaf certificates, when it was given a CA and has a TLS port to present them on."""
    if ca is None:
        return None
    if settings.tls_listen is None:
        log.warning("ca_unused", reason="--ca-cert and --ca-key are given but not --tls-listen: no TLS port")
        return None
    from cachenode.tls.certificates import Leaves

    table = settings.origin_table
    return Leaves(ca, certificate_name=table.certificate_name, folder=settings.data_dir / "leaves")


def build_tls_port(settings: CacheSettings, leaves: Leaves | None, *, on_outcome: Callable[[str], None],
                   on_fallback: Callable[[str], None], adopt, backlog: int, gate) -> TlsPort:
    """The TLS port (`tls_listen`), not yet listening: each connection's server
    name routed to termination with a leaf of the Nezha CA (`adopt` makes the
    handshake and serves it), to the real host, or to the parent's TLS port."""
    table = settings.origin_table
    parent_tls = None if settings.parent is None else (URL(settings.parent).host, settings.parent_tls_port)

    def route_for(name: str) -> Terminate | Relay | None:
        origin = table.get(name)
        if origin is None:
            return None
        if leaves is not None and origin.tls == "terminate":
            return Terminate(leaves.context_for(name))
        direct = passthrough_target(name, origin.upstream_for("https", name))
        if parent_tls is not None:
            # A sidecar: its parent's TLS port routes by the same name, and
            # terminates or passes through as the cluster is set up.
            return Relay(*parent_tls, fallback=direct)
        return Relay(*direct)

    return TlsPort(route_for, hello_timeout=settings.request_head_timeout,
                   connect_timeout=settings.origin_connect_timeout, on_outcome=on_outcome, on_fallback=on_fallback,
                   adopt=adopt, backlog=backlog, gate=gate)


async def serve(settings: CacheSettings, *, stop: asyncio.Event | None = None, ca: Pair | None = None,
                reuse_port: bool = False, primary: "Primary | None" = None) -> None:
    """Run one node until SIGINT/SIGTERM (or `stop` is set). `ca`: read_ca(settings), when read already.
    As the primary of a node's workers (cachenode/workers/): `reuse_port`, and `primary`, whose
    `counted` the node's /metrics awaits and whose `attach` is called once the node serves (it
    returns what to call when it stops)."""
    leaves = leaves_for(settings, ca or read_ca(settings))
    open_files = raise_open_files_limit()
    node = build_node(settings, before_metrics=primary.counted if primary is not None else None)
    listener = Listener(node, open_files=open_files)
    host, port = settings.listen_addr
    try:
        await listener.start(host, port, reuse_port=reuse_port)
    except OSError as e:
        await listener.close()
        raise RunError(f"cannot listen on {settings.listen} (--listen): {e.strerror or e}") from e
    relay = await _start_tls_port(settings, node, listener, leaves, reuse_port=reuse_port)
    admin = await _start_admin(settings, node, listener, relay)
    # Before the line that says it serves: a SIGTERM right after it drains and exits 0
    # (it killed the process outright in 3 to 4 of 12 tries when installed after).
    stop = stop_on_signals(stop, hangup=hangup_stops())
    _log_listening(settings, listener, leaves, open_files)
    detach = primary.attach(node, listener) if primary is not None else None
    try:
        await stop.wait()
        # Still serving while it hands off: the new owners copy from here.
        await node.leave()
    finally:
        log.info("node_stopping", listen=settings.listen)
        if admin is not None:
            await admin.cleanup()
        if relay is not None:
            await relay.close()
        if detach is not None:
            detach()
        await listener.close()
        flush_repeats()


async def _start_tls_port(settings: CacheSettings, node: CacheNode, listener: Listener, leaves: Leaves | None, *,
                          reuse_port: bool) -> TlsPort | None:
    """The TLS port listening (None without `tls_listen`); the listener is closed if it cannot listen."""
    if settings.tls_listen is None:
        return None
    tls_outcomes = node.metrics.tls_connections
    fallbacks = node.metrics.parent_fallbacks
    relay = build_tls_port(settings, leaves, on_outcome=lambda outcome: tls_outcomes.labels(outcome).inc(),
                           on_fallback=lambda reason: fallbacks.labels(reason=reason).inc(),
                           adopt=listener.adopt, backlog=listener.backlog, gate=listener.gate)
    tls_host, tls_port = parse_hostport(settings.tls_listen, field="tls_listen")
    try:
        await relay.start(tls_host, tls_port, reuse_port=reuse_port)
    except OSError as e:
        await listener.close()
        raise RunError(f"cannot listen on {settings.tls_listen} (--tls-listen): {e.strerror or e}") from e
    return relay


async def _start_admin(settings: CacheSettings, node: CacheNode, listener: Listener,
                       relay: TlsPort | None) -> web.AppRunner | None:
    """The admin port serving (None without `admin_listen`); the ports opened before it are closed if it
    cannot listen."""
    if settings.admin_listen is None:
        return None
    admin = web.AppRunner(build_admin_app(node), access_log=None, handle_signals=False)
    await admin.setup()
    admin_host, admin_port = parse_hostport(settings.admin_listen, field="admin_listen")
    try:
        await web.TCPSite(admin, admin_host, admin_port).start()
    except OSError as e:
        await admin.cleanup()
        if relay is not None:
            await relay.close()
        await listener.close()
        raise RunError(f"cannot listen on {settings.admin_listen} (--admin-listen): {e.strerror or e}") from e
    return admin


def _log_listening(settings: CacheSettings, listener: Listener, leaves: Leaves | None, open_files: int) -> None:
    """The one line saying the node serves, and how it is set up: what tests and operators wait for."""
    log.info("node_listening", listen=settings.listen, admin_listen=settings.admin_listen, tls_listen=settings.tls_listen, data_dir=str(settings.data_dir),
             origins={o.host: o.upstream for o in settings.origins}, capacity=settings.capacity,
             tls=None if settings.tls_listen is None else ("terminate" if leaves is not None else "passthrough"),
             fast_hits=settings.fast_hits, open_files=open_files, max_connections=listener.gate.limit,
             request_head_timeout=settings.request_head_timeout, parent=settings.parent)
