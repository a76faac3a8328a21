"""Wiring of one cache node: settings -> store, origin client, handlers -> aiohttp app."""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import web

from cachenode.metrics import Metrics
from cachenode.origin import OriginClient
from cachenode.proxy import NODE, CacheNode, access_log
from cachenode.store import Store
from nezha.config import CacheSettings
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
    app = web.Application(middlewares=[access_log])
    app.router.add_route("*", "/{tail:.*}", node.handle)

    async def lifecycle(app: web.Application):
        await node.start()
        yield
        await node.stop()

    app.cleanup_ctx.append(lifecycle)
    app[NODE] = node
    return app


async def serve(settings: CacheSettings, *, stop: asyncio.Event | None = None) -> None:
    """Run one node until SIGINT/SIGTERM (or `stop` is set)."""
    node = build_node(settings)
    app = build_app(node)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, port = settings.listen_addr
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    log.info("node_listening", listen=settings.listen, data_dir=str(settings.data_dir),
             origins={o.host: o.upstream for o in settings.origins}, capacity=settings.capacity)
    stop = stop_on_signals(stop)
    try:
        await stop.wait()
    finally:
        log.info("node_stopping", listen=settings.listen)
        await runner.cleanup()
