"""Asking peers to copy an object from this node: replicas after a fill, and each object a hand-off hands on.

The other half of cluster/handoff.py, which answers these requests: a node
that filled an object from the origin asks the key's other owners to copy
it (`replicate_soon`), and a node handing off asks each new owner
(`ask_to_copy`). It needs no fill engine, so the engine is handed
`replicate_soon` when it is built: the loop between them is gone.

A small object's replicas travel with others bound for the same peer, in
one request (cluster/replica_batches.py); a large one's each in a call of
its own. A copy takes as long as the object takes to cross the network, which for a
dataset can be minutes. The replicate call therefore proves it is alive with
a line a second instead of answering at the end: the caller gives up after
`REPLICATE_SILENCE` without a line, never because a copy is merely long.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Coroutine

import aiohttp
import structlog

from cachenode.cluster.replica_batches import ReplicaBatches
from cachenode.cluster.view import ClusterView
from cachenode.fill.origin import OriginClient
from cachenode.http.vary import selecting_headers
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.config import CacheSettings
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import REPLICATE_PATH, TOKEN_HEADER, replicate_failed

log = structlog.get_logger("nezha.handoff")

REPLICATE_SILENCE = 10.0  # a caller gives up on a replicate call silent this long


def internal_headers(token: str | None) -> dict[str, str]:
    """The headers of a node's calls to its peers' internal endpoints (a JSON body, the cluster token)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers[TOKEN_HEADER] = token
    return headers


class Replicas:
    """Given what it uses: the ring view, the store (a batch's bodies), the
    client it asks peers with, and how to run background work."""

    def __init__(self, *, node_id: str, settings: CacheSettings, cluster: ClusterView, store: Store,
                 client: OriginClient, spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]) -> None:
        self.node_id = node_id
        self.settings = settings
        self.cluster = cluster
        self.client = client
        self.spawn = spawn
        self.batches = ReplicaBatches(node_id=node_id, settings=settings, store=store, client=client, spawn=spawn,
                                      one_by_one=lambda peer, target, selecting: self.ask_to_copy(
                                          peer, target, headers=selecting))

    def replicate_soon(self, meta: Meta, target: Target) -> None:
        """After a fill from the origin: have the key's other owners copy it from here."""
        others = [p for p in self.cluster.owners(meta.key) if p.id != self.node_id]
        if not others:
            return
        selecting = selecting_headers(meta.vary, meta.variant)
        if selecting is None:
            log.info("replica_not_asked", key=meta.key, reason="its variant cannot be spelled as request fields")
            return
        if self.batches.takes(meta):
            for peer in others:
                self.batches.add(peer, meta, target, selecting)
            return
        self.spawn(self._push(others, target, selecting))

    async def _push(self, peers: list[Peer], target: Target, selecting: dict[str, str]) -> list[str]:
        return list(await asyncio.gather(*(self.ask_to_copy(p, target, headers=selecting) for p in peers)))

    async def ask_to_copy(self, peer: Peer, target: Target, *, on_bytes: Callable[[int], None] | None = None,
                          headers: dict[str, str] | None = None) -> str:
        """Have `peer` copy `target`'s object from this node; its ReplicateResult, or replicate_failed(why).

        Waits for the whole copy however long it takes, as long as `peer`
        keeps reporting progress; `on_bytes` gets the bytes as they arrive.
        """
        settings = self.settings
        body: dict[str, Any] = {"scheme": target.scheme, "host": target.host, "path": target.path_qs,
                                "source": self.node_id,
                                "address": settings.advertise or settings.listen}
        if headers:
            body["headers"] = headers
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.peer_timeout,
                                        sock_read=REPLICATE_SILENCE)
        try:
            r = await self.client.request(
                "POST", peer.url + REPLICATE_PATH, headers=internal_headers(self.settings.cluster_token),
                what=f"peer {peer.id} replicate", json=body, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - any failure only means one missing replica
            log.warning("replicate_failed", peer=peer.id, path=target.path, error=str(e))
            return replicate_failed(e)
        seen = 0

        def advance(n: object) -> None:
            nonlocal seen
            if isinstance(n, int) and n > seen:
                if on_bytes is not None:
                    on_bytes(n - seen)
                seen = n

        try:
            if r.status != 200:
                text = (await r.text())[:200]
                log.warning("replicate_failed", peer=peer.id, path=target.path, status=r.status, body=text)
                return replicate_failed(f"{r.status} {text}")
            result: str | None = None
            async for line in r.content:  # one JSON object a line
                if not line.strip():
                    continue
                message = json.loads(line)
                if not isinstance(message, dict):
                    raise ValueError(f"not a JSON object: {line[:100]!r}")
                advance(message.get("copying", message.get("bytes")))
                if "result" in message:
                    result = str(message["result"])
            if result is None:
                result = replicate_failed(f"{peer.id} ended the replicate answer without a result")
            log.info("replicated", peer=peer.id, path=target.path, result=result, bytes=seen)
            return result
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            log.warning("replicate_failed", peer=peer.id, path=target.path, bytes=seen,
                        error=f"{type(e).__name__}: {e}")
            return replicate_failed(f"{type(e).__name__} after {seen} bytes: {e}")
        finally:
            r.release()
