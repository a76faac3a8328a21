"""`/_nezha/prefetch`: the controller's fills of public objects, many in one request, run here.

    POST /_nezha/prefetch  {"urls": ["http://data.example/a.bin", ...], "fills": 16}
      -> 200, application/x-ndjson: one line per URL, as each ends (empty lines between: still working)
         {"url": U, "stored": SIZE}                   stored here (already, or by this fill)
         {"url": U, "status": 302, "location": L}     a redirect, not stored: the controller follows it
         {"url": U, "status": S, "failed": WHY}       refused (403: not an origin) or failed (502, 504)
         {"url": U, "status": S, "passed": WHY}       the origin's answer (S) may not be stored
         {"url": U, "not_here": WHY}                  not this node's to fill so: ask it the ordinary way
         {"url": U, "wait": true}                     it waited its longest behind live traffic: ask again

Why: a prefetch of many small objects cost the controller two requests an
object (the fill's ranged GET, a share of a `/_nezha/stored` batch) and
the node a request to parse, route, pace, answer and log for each, dearer
than the client's read it stands for (docs/benchmarks.md, "Prefetch by
manifest"). Here one request carries as many objects as the controller
has in flight for this node, nothing of a body crosses to the
controller, and each line is sent once its object is stored, so no
"stored yet?" follows.

Never an open proxy: a URL gets the checks a client's read gets (a host of
the origin table, a target that parses, no credentials in the URL, which a
read would pass through unstored), and the fill goes through the same
single flight, store and counts. What this path does not do, it hands
back as `not_here` for the ordinary request: an `authorize` origin's object
(filled by a signed read, front/authorized.py), a key whose first owner is
another node (the ordinary read relays it), a flight another request led
and passed on unstored.

Each fill waits for a slot of the node's pacing (front/pacing.py) as a
`fill` request does, and gives it back once stored, so live traffic still
holds the prefetch to `--prefetch-busy-fills`. `fills` (optional) is the
controller's bound on its fills running here at once: it names more URLs
than that ahead of time, which wait here for a slot, so a slot given back
starts the next fill at once instead of a round trip to the controller
later. Internal, like every
`/_nezha/` path: the cluster token (front/routes.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from cachenode.fill.engine import LeaderGone
from cachenode.fill.flights import Flight, Kind, Outcome
from cachenode.fill.upstream import Upstream
from cachenode.front.pacing import Pacing
from cachenode.front.reads import Reads
from cachenode.front.names import resolve
from cachenode.http.freshness import Use, may_serve_stale_on_error, request_directives
from cachenode.store.objects import Meta
from nezha.credentials import redact_text
from nezha.errors import OriginTimeout
from nezha.keys import BadHost, BadTarget, Target, credentials_kept
from nezha.origins import Origin, OriginTable
from nezha.ring import Peer

log = structlog.get_logger("nezha.cachenode")

MAX_URLS = 10_000  # one request's URLs
MAX_CAP = 1024  # the controller's --prefetch-fills at most
ATTEMPTS = 5  # a flight whose leader vanished is looked at again, as a joiner's read does; bounded
REDIRECTS = frozenset({301, 302, 303, 307, 308})
NO_DIRECTIVES = request_directives({})
KEEPALIVE = 10.0  # seconds without a line before an empty one (the controller reads for 60 s at most)


class PrefetchFills:
    def __init__(self, *, table: OriginTable, node_id: str, reads: Reads, upstream: Upstream,
                 owners: Callable[[str], list[Peer]], pacing: Pacing,
                 clock: Callable[[], float] = time.time) -> None:
        """`owners(key)`: the key's owners in ring order (cluster_view.py)."""
        self._clock = clock
        self._table = table
        self._node_id = node_id
        self._reads = reads
        self._upstream = upstream
        self._owners = owners
        self._pacing = pacing

    async def endpoint(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        urls, cap = _urls(body), _cap(body)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        running = {asyncio.ensure_future(self.one(url, cap)) for url in dict.fromkeys(urls)}
        try:
            while running:
                done, running = await asyncio.wait(running, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED)
                # What ended together goes in one write: a line each, in one segment; an empty line
                # when nothing ended for a while, so a large object's fill never looks like a silent node.
                await resp.write(b"".join(json.dumps(t.result(), separators=(",", ":")).encode() + b"\n"
                                          for t in done) or b"\n")
        finally:
            for t in running:  # the controller went away: what it no longer waits for is not started
                t.cancel()
        await resp.write_eof()
        return resp

    async def one(self, url: str, cap: int | None = None) -> dict:
        """One URL's line: its checks, its slot of the pacing (at most `cap` of the controller's at once), its
        fill."""
        parts = urlsplit(url)
        try:
            target, origin, key = resolve(self._table, parts.path + (f"?{parts.query}" if parts.query else "")
                                          or "/", parts.netloc, scheme=parts.scheme or "http")
        except BadHost as e:
            return {"url": url, "status": 403,
                    "failed": f"{e}: not a configured origin; this cache is not an open proxy"}
        except BadTarget as e:
            return {"url": url, "status": 400, "failed": f"bad request: {e}"}
        if origin is None or key is None:
            return {"url": url, "status": 403,
                    "failed": f"host {target.host!r} is not a configured origin; this cache is not an open proxy"}
        if origin.credentials == "authorize":
            return {"url": url, "not_here": "an authorize origin's object is filled by a signed read"}
        if kept := credentials_kept(target, origin):
            return {"url": url, "passed": f"the URL carries credentials ({', '.join(kept)}): never stored"}
        owners = self._owners(key)
        if owners and owners[0].id != self._node_id:  # a read here would relay it to that owner
            return {"url": url, "not_here": f"{owners[0].id} owns it first"}
        meta = self._stored(key, target.host)
        if meta is not None:
            return {"url": url, "stored": meta.size}
        try:
            async with asyncio.timeout(self._pacing.wait):  # not wait_for: no task between, no step of delay
                await self._pacing.fill(key, cap)
        except TimeoutError:
            self._pacing.told_to_wait += 1
            return {"url": url, "wait": True}
        try:
            return {"url": url, **await self._fill(key, target=target, origin=origin)}
        except Exception as e:  # noqa: BLE001 - this URL's line says it; the batch's other URLs go on
            log.error("prefetch_fill_error", key=key, error=f"{type(e).__name__}: {e}")
            return {"url": url, "status": 500, "failed": redact_text(f"filling {key} here: {type(e).__name__}: {e}")}
        finally:
            self._pacing.stored(key)

    def _stored(self, key: str, host: str) -> Meta | None:
        """A copy that answers a read without the origin (fresh, or stale-while-revalidate)."""
        meta = self._reads.store.lookup(key, {"Host": host})
        use = self._reads.use(meta, NO_DIRECTIVES)
        return meta if use is Use.FRESH or use is Use.STALE_WHILE_REVALIDATE else None

    async def _fill(self, key: str, *, target: Target, origin: Origin) -> dict:
        """Join or lead the key's flight, as a read does, until it says stored or why not."""
        engine = self._reads.engine
        url = origin.url_of(target)
        headers = {"Host": target.host}
        for _ in range(ATTEMPTS):
            if (meta := self._stored(key, target.host)) is not None:
                return {"stored": meta.size}
            stale = self._reads.store.lookup(key, headers)
            flight, leader = engine.flights.lead_or_join(key)
            response = None
            if leader:
                outcome, response = await engine.lead(
                    flight, key=key, url=url, origin=origin, stale=stale, target=target,
                    source=engine.origin_source(url, headers, route=self._upstream.route_for(target, headers)))
            else:
                outcome = await asyncio.shield(flight.outcome)
            answer = await self._outcome(key, flight, outcome, response, stale=stale)
            if answer is not None:
                return answer
        return {"not_here": f"the origin exchange for {key} kept restarting"}

    async def _outcome(self, key: str, flight: Flight, outcome: Outcome, response, *,
                       stale: Meta | None) -> dict | None:
        """What a flight's outcome says of the object; None: look again (its leader vanished)."""
        if outcome.kind is Kind.STREAMING:
            await flight.landed.wait()  # stored, or failed, by then
            size = self._reads.store.stored_size(key)
            if size is not None:
                return {"stored": size}
            error = outcome.fill.error if outcome.fill is not None else None
            return {"status": 502, "failed": redact_text(f"the fill of {key} ended unstored: {error}")}
        if outcome.kind is Kind.STORED or outcome.kind is Kind.REVALIDATED:
            assert outcome.meta is not None
            return {"stored": outcome.meta.size}
        if outcome.kind is Kind.PASSED:
            if response is None:  # another request led it: its answer was its own
                return {"not_here": "the origin's answer to another request was passed on, not stored"}
            status, location = response.status, response.headers.get("Location")
            response.release()
            if status in REDIRECTS and location:
                return {"status": status, "location": location}
            return {"status": status, "passed": f"the origin answered {status}, which may not be stored"}
        error = outcome.error
        if isinstance(error, LeaderGone):
            return None
        if stale is not None and may_serve_stale_on_error(now=self._clock(), expires_at=stale.expires_at,
                                                          stale_if_error=stale.stale_if_error):
            return {"stored": stale.size}  # a read would be answered from it: it stays stored
        log.info("prefetch_fill_failed", key=key, error=str(error))
        return {"status": 504 if isinstance(error, OriginTimeout) else 502, "failed": redact_text(str(error))}


async def _body(request: web.Request) -> object:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as e:
        raise web.HTTPBadRequest(text=f"/_nezha/prefetch: the body is not JSON ({e})\n") from e


def _urls(body: object) -> list[str]:
    urls = body.get("urls") if isinstance(body, dict) else None
    if not isinstance(urls, list) or len(urls) > MAX_URLS or not all(isinstance(u, str) for u in urls):
        raise web.HTTPBadRequest(text=f'/_nezha/prefetch: "urls" is not a list of at most {MAX_URLS} strings\n')
    return urls


def _cap(body: object) -> int | None:
    cap = body.get("fills") if isinstance(body, dict) else None
    if cap is None:
        return None  # a controller that sends none: the node's own bounds alone
    if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= MAX_CAP:
        raise web.HTTPBadRequest(text=f'/_nezha/prefetch: "fills" is not a whole number from 1 to {MAX_CAP}\n')
    return cap
