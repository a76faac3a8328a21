"""The fast path's questions about one plain hit, over a store's index:
which fresh object a plain GET or HEAD names (with its response head and
data path, memoised) and the access log line of a hit served.

What a follower worker needs of a node, and no more (cachenode/workers/
follower.py): it holds a copy of the primary's index and answers plain hits
with this, and counts none of them itself (the primary does). A node's
fast path asks it too, and the node's handler counts each hit.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import structlog

from cachenode.front.plain import response_head
from cachenode.front.names import names_origin, resolve
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.credentials import redact_url
from nezha.keys import BadTarget, Target
from nezha.memo import keep
from nezha.origins import Origin, OriginTable
from nezha.wire import CacheOutcome

log = structlog.get_logger("nezha.cachenode")

_PLAIN_CACHE = 4096  # entries in each memo; cleared when full

Named = tuple[Target, Origin, str]  # a request's target, the origin configured for it, its key


def hit_label(meta: Meta) -> CacheOutcome:
    """A fresh stored object's X-Nezha-Cache: a hot copy says so."""
    return CacheOutcome.HOT_HIT if meta.hot else CacheOutcome.HIT


class PlainHitFinder:
    def __init__(self, *, table: OriginTable, store: Store, via: str, node_id: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.store = store
        self.via = via
        self.node_id = node_id
        self._clock = clock
        # The log level is set once, before a node is made (nezha.logs.configure):
        # below info, a plain hit skips building its request_completed line.
        self._log_hits = log.is_enabled_for(logging.INFO)
        # Request line and Host -> what it names (`named`), key -> (meta, head, path).
        self._names: dict[tuple[str, str, str], Named] = {}
        self._heads: dict[str, tuple[Meta, bytes, str]] = {}
        # Host field -> whether it names an origin (`names_origin`): each new path
        # of a cold epoch comes with one of a few Host fields.
        self._hosts: dict[str, bool] = {}

    def plain_hit(self, named: Named) -> tuple[Meta, bytes, str] | None:
        """The fresh stored object a plain GET/HEAD asks for, with its response
        head and data path, if this node serves it itself as the handler would (a
        fresh local copy is served whoever owns the key). None sends the request
        through the full handler, or to a fast miss (front/fast_misses.py).
        `named`: what the request names (`named`, with https for a connection
        whose TLS this process ended, a follower worker's, cachenode/workers/),
        asked once for the hit and the miss."""
        key = named[2]
        meta = self.store.lookup(key)
        if meta is None or meta.status != 200 or meta.authorize or meta.chunk_size or not meta.fresh(self._clock()):
            return None  # a chunked object is read from its chunks' owners, not sent from one file
        if meta.blocks and self.store.verify_reads:
            return None  # its blocks are checked before they leave (front/respond.py), not sent unread
        prepared = self._heads.get(key)
        if prepared is None or prepared[0] is not meta:
            prepared = keep(self._heads, key, (meta, response_head(meta, via=self.via, served_by=self.node_id),
                                               self.store.data_path(meta)), _PLAIN_CACHE)
        return prepared

    def named(self, raw_target: str, host_header: str, scheme: str = "http") -> Named | None:
        """What a plain request names (front/names.py `resolve`): its target,
        origin and the key a plain hit may be found under (`plain_hit`), or a
        miss the fast path leads (front/fast_misses.py); memoised, as a hit's
        request comes again and again. None: never a plain hit, nor a miss the
        fast path leads."""
        asked = (scheme, raw_target, host_header)
        named = self._names.get(asked)
        if named is not None:
            return named
        for_origin = self._hosts.get(host_header)
        if for_origin is None:
            for_origin = keep(self._hosts, host_header, names_origin(self.table, host_header), _PLAIN_CACHE)
        if not for_origin:
            return None
        try:
            target, origin, key = resolve(self.table, raw_target, host_header, scheme=scheme)
        except BadTarget:
            return None
        if key is None or origin is None or origin.credentials == "authorize":
            return None  # an authorize origin's reads are each the origin's to allow: never a plain hit
        return keep(self._names, asked, (target, origin, key), _PLAIN_CACHE)

    def log_fast_hit(self, meta: Meta, *, method: str, path: str, sent: int, ms: float, gone: bool = False,
                     status: int = 200) -> None:
        """The access log half of a fast hit: one line, written by the worker that served it."""
        if not self._log_hits:
            return  # below the log level: not even the fields are worth making
        if gone:
            log.info("client_gone", key=meta.key, bytes=sent)
        log.info("request_completed", method=method, host=meta.host, path=redact_url(path)[:300], status=status,
                 cache=hit_label(meta), bytes=sent, ms=round(ms, 2), fast=True, **({"broken": True} if gone else {}))
