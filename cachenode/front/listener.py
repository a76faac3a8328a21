"""A node's listening socket and the aiohttp application behind it.

Every client connection enters through the fast path, which answers plain
hits itself and hands the rest, with the connection, to aiohttp: the
middlewares, then the node's request handler. Connections the TLS port
accepted and terminated are adopted here.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import ssl
import time
from typing import Callable, Protocol

import structlog
from aiohttp import web

from cachenode.front.client_conn import ClientConnection
from cachenode.front.connections import listen_backlog, node_gate, serve_handed
from cachenode.front.fastpath import FastPath
from cachenode.front.handler import Handler
from cachenode.front.middleware import FROM_PEER, METRICS, access_log, head_prepared, refuse_methods
from cachenode.front.pacing import Pacing, paced
from cachenode.metrics import Metrics
from nezha.config import CacheSettings

log = structlog.get_logger("nezha.connections")


class Served(Protocol):
    """What the listener needs of the node it serves (cachenode/node.py):
    its handler, its settings and metrics, and to start and stop it with
    the application."""

    settings: CacheSettings
    metrics: Metrics
    handler: Handler
    pacing: Pacing

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def build_app(node: Served) -> web.Application:
    app = web.Application(middlewares=[access_log, refuse_methods, paced(node.pacing)])
    app.router.add_route("*", "/{tail:.*}", node.handler.handle, expect_handler=node.handler.expect)

    async def lifecycle(app: web.Application):
        await node.start()
        yield
        await node.stop()

    app.cleanup_ctx.append(lifecycle)
    app[METRICS] = node.metrics
    app[FROM_PEER] = node.handler.from_peer
    app.on_response_prepare.append(head_prepared)
    return app


def build_admin_app(node: Served) -> web.Application:
    """The probes and metrics alone (`admin_listen`), for a node whose data
    port is on loopback: a sidecar listens on 127.0.0.1, where the kubelet's
    probes (sent to the pod's IP) and Prometheus cannot reach it. Nothing
    else answers here, so this port never serves or fetches an object."""
    app = web.Application(middlewares=[access_log])
    app.router.add_route("*", "/{tail:.*}", node.handler.routes.admin_port)
    app[METRICS] = node.metrics
    return app


class Listener:
    """A node's listening socket: every connection enters through the fast
    path (cachenode/front/fastpath.py), which admits it through the connection
    `Gate` and answers plain hits, and is handed to aiohttp for the rest.

    Connections still on the fast path are closed after `idle_timeout` without
    a byte from the client, as aiohttp closes its idle keep-alive ones after
    the same time, so idle connections cannot pile up; a request head gets
    `request_head_timeout` to arrive (cachenode/front/connections.py).
    """

    def __init__(self, node: Served, *, idle_timeout: float = 3630.0,  # aiohttp's default
                 open_files: int | None = None) -> None:
        self.node = node
        self.idle_timeout = idle_timeout
        self.runner = web.AppRunner(build_app(node), access_log=None, handle_signals=False,
                                    keepalive_timeout=idle_timeout)
        open_files = open_files or resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.backlog = listen_backlog(open_files)
        self.gate = node_gate(node.settings.max_connections, open_files, metrics=node.metrics)
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task | None = None
        self._handler = None
        self._adopting: set[asyncio.Task] = set()
        self.host = ""
        self.port = 0
        self._closed = False

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Listen on host:port; `reuse_port` when the node's other workers
        listen on the same port (cachenode/workers/), the kernel spreading
        new connections over them."""
        self.host = host
        await self.runner.setup()
        server = self.runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        head_timeout = self.node.settings.request_head_timeout

        def handler() -> ClientConnection:
            # The handler aiohttp's Server would make (same settings), plus the gate and head timer.
            return ClientConnection(server, loop=loop, gate=self.gate, head_timeout=head_timeout,
                                    **server._kwargs)

        self._handler = handler
        self._server = await loop.create_server(
            self._fast_path, host, port, reuse_address=True, reuse_port=reuse_port or None, backlog=self.backlog)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.create_task(self._sweep())

    def _fast_path(self, received: bytes = b"", eof: bool = False,
                   give_back: Callable[[asyncio.Transport], bool] | None = None) -> FastPath:
        return FastPath(finder=self.node.handler.plain, served=self.node.handler, aiohttp_protocol=self._handler,
                        gate=self.gate, head_timeout=self.node.settings.request_head_timeout,
                        serve_hits=self.node.settings.fast_hits, received=received, eof=eof,
                        misses=self.node.handler.misses, give_back=give_back)

    def adopt_handed(self, fd: int, received: bytes, eof: bool, *, secure: bool = False,
                     give_back: Callable[[asyncio.Transport], bool] | None = None) -> None:
        """Serve a client connection another worker of this node accepted and
        handed here (cachenode/workers/), with the bytes it had read of it:
        it enters the fast path as if accepted here. `secure`: the other
        worker ended the client's TLS and passes its requests on in the
        clear; they are https requests, served by aiohttp as the TLS port's
        are (the fast path serves plain http only). `give_back`: how a plain
        one goes back to that worker once it reads hits (front/giving_back.py)."""
        sock = socket.socket(fileno=fd)
        if self._closed:
            sock.close()
            return

        def protocol() -> asyncio.Protocol:
            if not secure:
                return self._fast_path(received, eof, give_back)
            conn = self._handler()
            conn.secure = True
            return conn

        serve_handed(sock, protocol, self._adopting, lost="handed_connection_lost")

    async def adopt(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        """Make the TLS handshake on a socket the TLS port accepted, then serve
        it like a plain client connection (its requests are `https://`). The
        fast path is skipped: sendfile cannot send through TLS. Raises when
        the handshake fails; the socket is closed then."""
        await asyncio.get_running_loop().connect_accepted_socket(
            self._handler, sock, ssl=context, ssl_handshake_timeout=self.node.settings.request_head_timeout)

    def _fast_connections(self) -> list[FastPath]:
        return [c for c in self.gate.open if isinstance(c, FastPath)]

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(10.0, self.idle_timeout / 2))
            cutoff = time.monotonic() - self.idle_timeout
            for conn in [c for c in self._fast_connections() if c.idle and c.last_active < cutoff]:
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
            for conn in self._fast_connections():
                conn.close()
        await self.runner.cleanup()
