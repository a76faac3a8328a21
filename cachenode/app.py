"""Wiring of one cache node: settings -> store, origin client, handlers -> aiohttp app."""

from __future__ import annotations

import asyncio
import time

import structlog
from aiohttp import web

from cachenode.fastpath import FastPath
from cachenode.metrics import Metrics
from cachenode.origin import OriginClient
from cachenode.proxy import NODE, CacheNode, access_log, refuse_methods
from cachenode.store import Store
from nezha.config import CacheSettings
from nezha.errors import RunError
from nezha.lifecycle import stop_on_signals

log = structlog.get_logger("nezha.cachenode")


def build_node(settings: CacheSettings) -> CacheNode:
    metrics = Metrics()
    node: CacheNode | None = None

    def on_evict(meta):
        if node is not None:
            node.on_evict(meta)

    store = Store(settings.data_dir, capacity=settings.capacity, on_evict=on_evict)
    origins = OriginClient(connect_timeout=settings.origin_connect_timeout,
                           read_timeout=settings.origin_read_timeout)
    index = None
    if settings.redis_url is not None:
        from cachenode.index import Index

        index = Index(redis_url=settings.redis_url, node_id=settings.identity,
                      flush_interval=settings.stats_flush_interval, refresh_interval=settings.ring_refresh_interval)
    node = CacheNode(settings=settings, store=store, origins=origins, metrics=metrics, index=index)
    return node


def build_app(node: CacheNode) -> web.Application:
    app = web.Application(middlewares=[access_log, refuse_methods])
    app.router.add_route("*", "/{tail:.*}", node.handle, expect_handler=node.expect)

    async def lifecycle(app: web.Application):
        await node.start()
        yield
        await node.stop()

    app.cleanup_ctx.append(lifecycle)
    app[NODE] = node
    return app


class Listener:
    """A node's listening socket: the fast path in front of aiohttp (or aiohttp alone).

    Connections still on the fast path are closed after `idle_timeout` without
    a byte from the client, as aiohttp closes its idle keep-alive ones after
    the same time, so idle or half-sent requests cannot pile up.
    """

    def __init__(self, node: CacheNode, *, idle_timeout: float = 3630.0) -> None:  # aiohttp's default
        self.node = node
        self.idle_timeout = idle_timeout
        self.runner = web.AppRunner(build_app(node), access_log=None, handle_signals=False,
                                    keepalive_timeout=idle_timeout)
        self._server: asyncio.AbstractServer | None = None
        self._site: web.TCPSite | None = None
        self._sweeper: asyncio.Task | None = None
        self._connections: set[FastPath] = set()
        self.host = ""
        self.port = 0
        self._closed = False

    async def start(self, host: str, port: int) -> None:
        self.host = host
        await self.runner.setup()
        if self.node.settings.fast_hits:
            aiohttp_protocol = self.runner.server
            assert aiohttp_protocol is not None
            self._server = await asyncio.get_running_loop().create_server(
                lambda: FastPath(node=self.node, aiohttp_protocol=aiohttp_protocol, connections=self._connections),
                host, port, reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        else:
            self._site = web.TCPSite(self.runner, host, port, reuse_address=True)
            await self._site.start()
            self.port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(10.0, self.idle_timeout / 2))
            cutoff = time.monotonic() - self.idle_timeout
            for conn in [c for c in self._connections if c.idle and c.last_active < cutoff]:
                conn.close()

    async def close(self) -> None:
        """Stop listening, close client connections, stop the node. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
            for conn in list(self._connections):
                conn.close()
        await self.runner.cleanup()


async def serve(settings: CacheSettings, *, stop: asyncio.Event | None = None) -> None:
    """Run one node until SIGINT/SIGTERM (or `stop` is set)."""
    listener = Listener(build_node(settings))
    host, port = settings.listen_addr
    try:
        await listener.start(host, port)
    except OSError as e:
        await listener.close()
        raise RunError(f"cannot listen on {settings.listen} (--listen): {e.strerror or e}") from e
    log.info("node_listening", listen=settings.listen, data_dir=str(settings.data_dir),
             origins={o.host: o.upstream for o in settings.origins}, capacity=settings.capacity,
             fast_hits=settings.fast_hits)
    stop = stop_on_signals(stop)
    try:
        await stop.wait()
        # Still serving while it hands off: the new owners copy from here.
        await listener.node.leave()
    finally:
        log.info("node_stopping", listen=settings.listen)
        await listener.close()
