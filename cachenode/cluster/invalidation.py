"""Forgetting objects a write replaced, on every node that may hold them.

A successful unsafe request (PUT, POST, DELETE, PATCH, any unknown method)
invalidates the stored response for its URL (RFC 9111 §4.4). In a cluster
the key's owners hold it, and so may any other node, as a hot copy
(docs/cache-node.md, "Hot copies"); any of them may answer the next GET, so
the node that forwarded the write tells every other member of the ring
before its client hears the origin's answer. Every member, not only those
with hot copies on: which nodes hold a hot copy is written nowhere, and a
node cannot know its peers' --hot-reads. Writes are rare in a dataset
cache; one small POST per node each is their price.

    POST /_nezha/invalidate  {"keys": ["http://host/path", ...], "reason": "..."}
                             -> {"removed": n}

With `"chunks": {"chunk_size": n, "etag": ..., "last_modified": ...}` a node
keeps the keys and removes only their chunks of that size and version
(cachenode/chunks/copies.py `drop_version`): the key's owner stored a new version of
a chunked object, and the old one's chunks, spread over every node, would
otherwise hold disk until evicted. Versions are compared, not removed
blindly, so the new version's chunks, which may be filling already, stay.

Like the other internal endpoints it needs the cluster token (or a loopback
client when none is set). A node that cannot be reached is logged and
skipped: a dead node serves nothing, and a write must not fail because a
cache node did. The one gap this leaves (a node that is unreachable now
but comes back with its old copy) is bounded by that copy's freshness.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Protocol

import aiohttp
import structlog
from aiohttp import web

from cachenode.cluster.replicas import internal_headers
from cachenode.cluster_view import ClusterView
from cachenode.fill.parallel import Validator
from cachenode.fill.origin import OriginClient
from nezha.config import CacheSettings
from nezha.ring import Peer
from nezha.wire import INVALIDATE_PATH

log = structlog.get_logger("nezha.invalidation")

MAX_KEYS = 16  # a write names its URL, Location and Content-Location: three


class OldChunks(Protocol):
    """How this node drops one version's chunks of a key (cachenode/chunks/copies.py `ChunkCopies`)."""

    async def drop_version(self, key: str, chunk_size: int, validator: Validator) -> int:
        """How many chunks went."""


class Broadcast:
    """Telling every other member of the ring to forget keys, or one version's
    chunks of a key. Needs only the ring view and the client, so the chunk
    copies that tell (`tell_old_chunks`) are handed it before the endpoint
    that drops them (`Invalidation`) is built."""

    def __init__(self, *, node_id: str, settings: CacheSettings, cluster: ClusterView, client: OriginClient) -> None:
        self.node_id = node_id
        self.settings = settings
        self.cluster = cluster
        self.client = client

    def _others(self) -> list[Peer]:
        return [Peer(i, address) for i, address in sorted(self.cluster.snapshot.nodes.items()) if i != self.node_id]

    async def tell_holders(self, keys: list[str], *, why: str) -> None:
        """Have every other member of the ring forget `keys`: each key's owners,
        and every other node for its hot copies. Waits for all of them."""
        others = self._others()
        if others:
            await asyncio.gather(*(self._tell(peer, keys, why) for peer in others))

    async def tell_old_chunks(self, key: str, *, chunk_size: int, validator: Validator, why: str) -> None:
        """Have every other member of the ring remove `key`'s chunks of that
        size and version (a new version replaced it); the key itself stays."""
        chunks = {"chunk_size": chunk_size, "etag": validator.etag, "last_modified": validator.last_modified}
        await asyncio.gather(*(self._tell(peer, [key], why, chunks=chunks) for peer in self._others()))

    async def _tell(self, peer, keys: list[str], why: str, *, chunks: dict | None = None) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.peer_timeout * 2)
        body: dict = {"keys": keys, "reason": why}
        if chunks is not None:
            body["chunks"] = chunks
        try:
            r = await self.client.request(
                "POST", peer.url + INVALIDATE_PATH, headers=internal_headers(self.settings.cluster_token),
                what=f"peer {peer.id} invalidate", json=body, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - an unreachable owner only keeps a copy it cannot serve
            log.warning("invalidate_failed", peer=peer.id, keys=keys, error=str(e))
            return
        try:
            if r.status != 200:
                log.warning("invalidate_failed", peer=peer.id, keys=keys, status=r.status,
                            body=(await r.text())[:200])
        finally:
            r.release()


class Invalidation:
    """The invalidation endpoint, and forgetting keys everywhere. Given what
    it uses, not the node: how this node forgets keys and drops old chunks,
    and how it tells the others (`Broadcast`)."""

    PATH = INVALIDATE_PATH

    def __init__(self, *, broadcast: Broadcast, forget: Callable[..., Awaitable[int]], old_chunks: OldChunks) -> None:
        self.broadcast = broadcast
        self.forget = forget
        self.old_chunks = old_chunks

    async def handle(self, request: web.Request) -> web.Response:
        """POST of the keys to forget here (or of an old version's chunks to
        drop). The route table (front/routes.py) has refused a caller without
        the cluster token before this runs."""
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["POST"], text=f"{self.PATH} takes POST\n")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as e:
            raise web.HTTPBadRequest(text=f"body is not JSON: {e}\n")
        keys = body.get("keys") if isinstance(body, dict) else None
        if not isinstance(keys, list) or not keys or len(keys) > MAX_KEYS or not all(
                isinstance(k, str) for k in keys):
            raise web.HTTPBadRequest(text=f"invalidate wants keys: a list of 1 to {MAX_KEYS} cache keys\n")
        reason = str(body.get("reason", ""))[:300]
        if "chunks" in body:
            try:
                chunk_size, validator = _old_chunks(body["chunks"])
            except ValueError as e:
                raise web.HTTPBadRequest(text=f"invalidate: {e}\n")
            removed = 0
            for key in keys:
                removed += await self.old_chunks.drop_version(key, chunk_size, validator)
            return web.json_response({"removed": removed})
        removed = await self.forget(keys, why=f"{reason} (told by {request.remote})")
        return web.json_response({"removed": removed})

    async def everywhere(self, keys: list[str], *, why: str) -> None:
        """Forget `keys` here and on every other node that may hold them, owner
        or hot copy (their copies would answer a GET with what the write replaced)."""
        await self.forget(keys, why=why)
        await self.broadcast.tell_holders(keys, why=why)


def _old_chunks(raw: object) -> tuple[int, Validator]:
    """(chunk size, version) of an invalidation's `chunks`; ValueError naming what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"chunks must be an object, not {type(raw).__name__}")
    size, etag, last_modified = raw.get("chunk_size"), raw.get("etag"), raw.get("last_modified")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"chunks.chunk_size must be a positive integer, not {size!r}")
    if not all(v is None or isinstance(v, str) for v in (etag, last_modified)) or (etag, last_modified) == (None, None):
        raise ValueError("chunks names no version: an etag or a last_modified string is needed")
    return size, Validator(etag=etag, last_modified=last_modified)
