"""Plain cold misses led below aiohttp (docs/cache-node.md, "Small objects").

A dataset's first epoch is a miss per file, each on a keep-alive connection
that asked for other files before: the fast path (front/fastpath.py) would
hand every such connection to aiohttp at its first miss, and the server, the
middlewares, the handler's routing and a `StreamResponse` would then cost
more than the fill itself. So a miss the fast path fully understands is led
here instead: a plain GET (no Range, no validators, no credentials, none of
a child tier's or a peer's fields) for a configured origin asked directly
(no parent tier), that this node is the first owner of, with nothing stored
under its key and no flight of it under way.

The flight is led by the same engine the handler's read loop leads with
(`FillEngine.lead`): one origin request, judged, stored and counted as
any fill. Its outcome is this module's to answer only when it is the plain
one: a 200 stored at once whose body is in memory (`simple_body`), sent
with its head in one write. Every other outcome (a fill that streams, an
answer passed on, an origin's failure) goes to the handler with the
connection, the answer in hand (`Led`), and the handler answers it as its
read loop would have (`Handler.handle`, `take_led`): the origin is never
asked twice. A request for the key while the flight is under way is the
handler's to join, as any joiner.

Each request still makes one `request_completed` line and moves the
counters the middlewares and the handler's answer would have moved, and
counts as live traffic for the prefetch pacing while it is answered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from cachenode.cluster_view import ClusterView
from cachenode.counts import Counts
from cachenode.fill.engine import NOT_FOR_FILLS, FillEngine, LeaderGone
from cachenode.fill.flights import Flight, Kind, Outcome, Source
from cachenode.fill.origin import Interim, forwarded_request_headers
from cachenode.fill.plain_get import plain_request
from cachenode.fill.small_gets import SmallGets
from cachenode.fill.recent_fills import RecentFills
from cachenode.fill.upstream import Upstream
from cachenode.front.hits import Named
from cachenode.front.pacing import Pacing
from cachenode.front.plain import PlainRequest, response_head
from cachenode.front.short_answers import origin_failure
from cachenode.http.freshness import request_bypasses_cache
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.credentials import redact_url
from nezha.keys import Target, credentials_kept
from nezha.memo import keep
from nezha.origins import Origin
from nezha.wire import FROM_CHILD_HEADER, CacheOutcome

log = structlog.get_logger("nezha.cachenode")

_FIELDS_MAX = 4096  # header blocks remembered (`_fields`); cleared when full
_FIELDS_BLOCK_MAX = 1024  # longer blocks are parsed every time
_UNSEEN = object()  # `PlainFields._fields.get`'s answer for a block not there


_Fields = tuple[CIMultiDictProxy[str], CIMultiDictProxy[str]]  # a request's fields, and the origin's


class Miss(NamedTuple):
    """A plain cold miss this node leads below aiohttp: what the handler's
    `_asked` would have resolved, and the client's fields. A named tuple: made
    for every cold miss, where a frozen dataclass costs twice as much to build."""

    key: str
    url: str  # where the origin is asked
    target: Target
    origin: Origin
    headers: CIMultiDictProxy[str]
    forwarded: CIMultiDictProxy[str]  # the fields the origin is sent (`FillEngine.origin_source`'s)
    flight: Flight  # led from `take` on, so no second request for the key can lead one too


@dataclass
class Led:
    """A flight the fast path led whose outcome the handler answers: the
    outcome, and the origin's answer when it is passed on (still unread)."""

    key: str
    outcome: Outcome
    response: aiohttp.ClientResponse | None

    def release(self) -> None:
        """Nobody will answer with it (the client went away): give its origin connection back."""
        if self.response is not None:
            self.response.release()
            self.response = None


def simple_body(outcome: Outcome) -> bytes | None:
    """The body the fast path sends itself: a 200 stored at once and whole
    in memory (`AtOnce.store_whole`), as `Responder.hit` would send it with
    `body=`; None: the handler answers this outcome."""
    meta, body = outcome.meta, outcome.body
    if outcome.kind is not Kind.STORED or meta is None or body is None:
        return None
    if meta.status != 200 or len(body) != meta.size or meta.chunk_size or meta.hot:
        return None
    return body


class PlainFields:
    """The fields of plain request heads and those the origin is sent for them,
    remembered by their bytes: clients send the same few blocks. Shared by the
    primary's fast misses and a follower's leads (cachenode/workers/follower_leads.py)."""

    def __init__(self, via: str) -> None:
        self._via = via
        # A request head's fields (all but its request line) -> the fields, or
        # None: not a request a fast miss leads.
        self._fields: dict[bytes, _Fields | None] = {}

    def of(self, head: bytes | bytearray) -> _Fields | None:
        """The fields of a plain request head and those the origin is sent for
        it; None when they make it anything but a plain read from the cache:
        a child tier's or a loop's (Via), or one the cache must not answer
        (credentials)."""
        start = head.find(b"\r\n") + 2
        block = bytes(head[start:])
        seen = self._fields.get(block, _UNSEEN)  # one look-up: None is an entry's value
        if seen is not _UNSEEN:
            return seen  # type: ignore[return-value]
        fields: CIMultiDict[str] = CIMultiDict()
        for line in block.decode("ascii").split("\r\n"):
            if line:
                name, _, value = line.partition(":")
                fields.add(name, value.strip(" \t"))
        judged: _Fields | None = None
        if "Via" not in fields and FROM_CHILD_HEADER not in fields and request_bypasses_cache(fields) is None:
            judged = (CIMultiDictProxy(fields), CIMultiDictProxy(
                forwarded_request_headers(fields, via=self._via, drop=NOT_FOR_FILLS)))
        return keep(self._fields, block, judged, _FIELDS_MAX, len(block), _FIELDS_BLOCK_MAX)


class Plain(NamedTuple):
    """A plain request a fast miss may lead: what it names, and its fields."""

    target: Target
    origin: Origin
    key: str
    headers: CIMultiDictProxy[str]
    forwarded: CIMultiDictProxy[str]  # the fields the origin is sent

    @property
    def url(self) -> str:
        """Where the origin is asked."""
        return self.origin.url_of(self.target)


def plain_cold(req: PlainRequest, head: bytes | bytearray, scheme: str, named: Named | None, fields: PlainFields,
               *, parent: object) -> Plain | None:
    """`req` (whose head is `head`) as a miss the fast path may lead, the
    primary's (`FastMisses.take`) or a follower's (workers/follower_leads.py):
    a plain GET, no Range, over plain HTTP, for a configured origin asked
    directly (no `parent` tier), whose fields ask nothing of the cache
    (`PlainFields`) and whose target keeps no credential. None: not one;
    whether anything is stored or in flight under its key is the caller's."""
    got = cold_fields(req, head, scheme, named, fields, parent=parent)
    return None if got is None else Plain(*named, *got)  # type: ignore[misc]


def cold_fields(req: PlainRequest, head: bytes | bytearray, scheme: str, named: Named | None, fields: PlainFields,
                *, parent: object) -> _Fields | None:
    """`plain_cold`'s judgement: the fields of a request it takes, and those
    the origin is sent; None: not one. Apart, so that `FastMisses.take`, which
    makes a `Miss` of them, does not make a `Plain` first."""
    if req.method != "GET" or req.range is not None or req.if_range is not None or scheme != "http":
        return None
    if parent is not None or named is None:
        return None  # a child tier's misses go to its parent (fill/upstream.py)
    got = fields.of(head)
    if got is None or credentials_kept(named[0], named[1]):
        return None
    return got


def miss_head(meta: Meta, via: str) -> bytes:
    """The head of a fill's answer stored at once, as `Responder.hit` sends
    it to the request that led it: a stored object's head (front/plain.py
    `response_head`) saying miss, with the origin's Age (none when 0)."""
    age = int(meta.age)
    return response_head(meta, via=via, label=CacheOutcome.MISS) + (b"Age: %d\r\n\r\n" % age if age else b"\r\n")


class FastMisses:
    def __init__(self, *, store: Store, engine: FillEngine, upstream: Upstream, cluster: ClusterView, node_id: str,
                 via: str, pacing: Pacing, counts: Counts, metrics: Metrics, recent: RecentFills | None = None,
                 small_gets: SmallGets | None = None) -> None:
        self.store = store
        self.engine = engine
        self.upstream = upstream
        self.cluster = cluster
        self.node_id = node_id
        self.via = via
        self.pacing = pacing
        self.counts = counts
        self.metrics = metrics
        self._log = log.is_enabled_for(logging.INFO)  # set once before a node is made, as for fast hits
        self._fields = PlainFields(engine.via)
        # Each origin's last fills led here, small or not: whether its next is
        # asked on the node's own connections (`small_gets`), and whether a
        # follower may lead that origin's fills (workers/lead_desk.py); None:
        # neither (kept only for them: it costs a few us a fill).
        self.recent = recent
        assert small_gets is None or recent is not None
        self.small_gets = small_gets  # None: every fill asked through the engine (`--no-small-gets`)
        self._timeout = aiohttp.ClientTimeout(total=None)

    # -- before the origin is asked -------------------------------------------
    def take(self, req: PlainRequest, head: bytes | bytearray, scheme: str, named: Named | None) -> Miss | None:
        """The miss `req` (whose head is `head`) if this module leads it; None:
        aiohttp and the handler serve it, nothing asked yet. As the handler
        routes it: only a GET that would lead a fill here, from the origin.
        `named`: what it names, as the hit lookup resolved it (front/hits.py
        `PlainHitFinder.named`: None for a Host naming no origin, a bad target
        or an `authorize` origin), so it is not resolved twice."""
        got = cold_fields(req, head, scheme, named, self._fields, parent=self.upstream.parent)
        if got is None:
            return None
        target, origin, key = named  # type: ignore[misc]  # not None: cold_fields took it
        headers, forwarded = got
        if self.engine.flights.get(key) is not None or self.store.lookup(key, headers) is not None:
            return None  # a joiner, or a stored copy (stale, or a variant): the read loop's
        owners = self.cluster.owners(key)
        if owners and owners[0].id != self.node_id:
            return None  # owners ahead of this node: relayed to them (front/relaying.py)
        # Led from now: a request for the key that comes before the origin answers joins it.
        flight, _ = self.engine.flights.lead_or_join(key)
        # By position (the names are Miss's own, in its order): keywords cost a quarter more per miss.
        return Miss(key, origin.url_of(target), target, origin, headers, forwarded, flight)

    # -- the flight ---------------------------------------------------------------
    async def lead(self, miss: Miss, *, interim: Interim) -> Outcome | Led:
        """Lead the flight of `miss`: the outcome when `simple_body` has its
        body, else a `Led` for the handler. Live traffic for the pacing meanwhile.
        Awaited at once after `take`: the flight is aborted however this ends early."""
        self.pacing.live_began()
        try:
            # As `FillEngine.origin_source` makes it for a plain GET (no Range: no resume; no peer: nothing handed).
            source = Source(url=miss.url, what=f"origin {miss.url}", headers=miss.forwarded, interim=interim,
                            read_here=True)
            small = await self._small_get(miss, source) if self.small_gets is not None else None
            if small is not None:
                outcome, response = small, None
            else:
                outcome, response = await self.engine.lead(miss.flight, key=miss.key, url=miss.url,
                                                           origin=miss.origin, stale=None, target=miss.target,
                                                           source=source)
        except BaseException as e:
            if not miss.flight.resolved():  # ended before the engine took it: its joiners look again
                self.engine.flights.abort(miss.flight, LeaderGone(f"request leading the fetch of {miss.key} "
                                                                  f"ended: {e!r}"))
            raise
        finally:
            self.pacing.live_ended()
        at_once = response is None and simple_body(outcome) is not None
        if self.recent is not None and outcome.kind is not Kind.FAILED:
            self.recent.record(miss.target.host, small=at_once or self._small(outcome))
        if at_once:
            return outcome
        return Led(key=miss.key, outcome=outcome, response=response)

    async def _small_get(self, miss: Miss, source: Source) -> Outcome | None:
        """The flight of `miss` led with the origin's answer read on the node's own connections
        (fill/small_gets.py), for a plain http:// origin whose recent fills were small; None: not asked
        that way, or anything but a small whole 200 stored at once, nothing stored: `FillEngine.lead` asks."""
        assert self.small_gets is not None and self.recent is not None
        small_max = self.store.small_max
        url = miss.url
        if small_max <= 0 or not url.startswith("http://") or not self.recent.small(miss.target.host):
            return None
        if not self.engine.asks_plainly(source, miss.origin):
            return None
        asked = plain_request(url, miss.forwarded, self._timeout)
        if asked is None:
            return None
        host, port, head = asked
        answer = await self.small_gets.get(host, port, head, small_max=small_max,
                                           timeout=self.engine.settings.origin_read_timeout, url=url)
        outcome = None if answer is None else await self.engine.lead_small(
            miss.flight, answer, key=miss.key, url=url, origin=miss.origin, target=miss.target, source=source)
        self.metrics.small_get(outcome is not None)
        return outcome

    def _small(self, outcome: Outcome) -> bool:
        """Whether a fill that streams is of an object a follower's lead would
        have stored (workers/follower_leads.py): its body came after its head,
        which a follower waits for."""
        fill = outcome.fill
        return (outcome.kind is Kind.STREAMING and fill is not None and fill.status == 200 and not fill.vary
                and fill.length is not None and 0 < fill.length <= self.store.small_max)

    # -- the answer ---------------------------------------------------------------
    def head(self, meta: Meta) -> bytes:
        return miss_head(meta, self.via)

    def answered(self, miss: Miss, meta: Meta, *, path: str, sent: int, ms: float, first_byte: float | None,
                 gone: bool = False) -> None:
        """Count and log a miss answered here, as the handler's answer and the
        middlewares would: a miss, its bytes, the request and its first byte,
        one `request_completed` line (and `client_gone` when it went away)."""
        self.counts.plain_miss(meta.host, sent, first_byte)
        if self._log:
            log_answered(miss.key, miss.target.host, path, sent=sent, ms=ms, gone=gone)

    def unanswered(self, miss: Miss, led: Led, *, path: str, ms: float) -> None:
        """A client that went away before the handler could answer its led
        miss: its answer released, one `client_gone` and one `request_completed` line."""
        kind = led.outcome.kind
        status, cache = 200, CacheOutcome.MISS
        if kind is Kind.PASSED:
            status, cache = (led.response.status if led.response is not None else 200), CacheOutcome.PASS
        elif kind is Kind.FAILED:
            status, cache = origin_failure(led.outcome.error).status, CacheOutcome.ERROR
        led.release()
        self.metrics.requests.labels(cache=cache).inc()
        if self._log:
            log.info("client_gone", key=miss.key, bytes=0)
            log.info("request_completed", method="GET", host=miss.target.host, path=redact_url(path)[:300],
                     status=status, cache=cache, bytes=0, ms=round(ms, 2), fast=True, broken=True)


def log_answered(key: str, host: str, path: str, *, sent: int, ms: float, gone: bool) -> None:
    """The lines of a miss the fast path answered (the primary's, or a
    follower's lead): one `request_completed`, and `client_gone` when it went away."""
    if gone:
        log.info("client_gone", key=key, bytes=sent)
    log.info("request_completed", method="GET", host=host, path=redact_url(path)[:300], status=200,
             cache=CacheOutcome.MISS, bytes=sent, ms=round(ms, 2), fast=True, **({"broken": True} if gone else {}))


def take_led(request: web.Request) -> Led | None:
    """The flight the fast path led for this request, handed over with its
    connection (`ClientConnection.led`): taken once, by the connection's
    first request, which is the one it was led for."""
    protocol = request.protocol
    led = getattr(protocol, "led", None)
    if led is not None:
        protocol.led = None  # type: ignore[union-attr]
    return led

