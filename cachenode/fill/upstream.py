"""Where a node's requests for an origin go: the origin, or the node's parent tier.

A node without `--parent` sends every such request to the origin URL it
was given (cachenode/fill/origin.py). A node with one (a sidecar, whose
parent is the cluster's Service) sends it to the parent instead, as a
client of the parent would: `http://PARENT` + the target's path, `Host:`
the origin's name (so the parent maps it to its own origin table), the
same fields, and FROM_CHILD_HEADER, so the parent goes to the origin and
never to a parent of its own. The parent's answer is used as the origin's
would be (its fields kept; its own X-Nezha-* fields are never stored).
When the parent cannot be reached, times out or answers 5xx of its own,
the request goes to the origin after all (`parent_fallback`, one log line
and `nezha_parent_fallbacks_total{reason}`): a job never fails because the
cluster did. The rules are cachenode/fill/parent.py's.

The route travels with each request explicitly (`route=`, the Target the
client asked for, or None for the origin itself): the handler decides it
once per request (`route_for`), so a fill, a pass-through and an
authorisation of one request all go the same way.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

import aiohttp
import structlog
from multidict import CIMultiDict
from yarl import URL

from cachenode.fill.origin import Interim, OriginClient
from cachenode.fill.parent import ParentHealth, answer_fallback, asks_parent, may_retry_on_origin
from cachenode.metrics import Metrics
from nezha.credentials import redact_url
from nezha.errors import OriginError, OriginTimeout
from nezha.keys import Target
from nezha.wire import CACHE_HEADER, FROM_CHILD_HEADER, ParentFallback

log = structlog.get_logger("nezha.cachenode")


class Upstream:
    def __init__(self, client: OriginClient, *, metrics: Metrics, parent: str | None = None,
                 connect_timeout: float = 5.0, read_timeout: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`read_timeout` bounds the wait for the parent's headers: a cold
        parent answers once its origin did, so give it the origin's connect
        and read timeouts (CacheNode does)."""
        self.client = client
        self.parent = URL(parent) if parent else None
        self._metrics = metrics
        self._health = ParentHealth()
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)

    def route_for(self, target: Target, client_headers: Mapping[str, str]) -> Target | None:
        """The target to ask the parent for on behalf of this client's request; None: the origin."""
        if asks_parent(has_parent=self.parent is not None, scheme=target.scheme,
                       from_child=FROM_CHILD_HEADER in client_headers):
            return target
        return None

    def answered_by_parent(self, response: aiohttp.ClientResponse) -> bool:
        """Whether `response` came from the parent (and not from the origin after a fallback).
        A node without a parent never reads the answer's URL (a small gets' answer parses it when read)."""
        if self.parent is None:
            return False
        u = response.url  # compared by parts: yarl tells "http://h" from "http://h:80"
        return (u.scheme, u.host, u.port) == (self.parent.scheme, self.parent.host, self.parent.port)

    async def request(self, method: str, url: str, *, headers: Mapping[str, str], what: str,
                      route: Target | None = None, data: object = None,
                      interim: Interim | None = None) -> aiohttp.ClientResponse:
        """The answer to `method url` from the parent when `route` names the
        target to ask it for, else (or when the parent fails) from the origin
        `url`. Raises OriginError / OriginTimeout as OriginClient does, for
        the origin: a failed parent is never the error a client sees.
        `interim` hears the 1xx answers of whichever is asked."""
        if route is None or self.parent is None:
            return await self.client.request(method, url, headers=headers, what=what, data=data, interim=interim)
        if self._health.skip(self._clock()):
            self._fell_back(ParentFallback.DOWN, route, "it failed within the last seconds")
            return await self.client.request(method, url, headers=headers, what=what, data=data, interim=interim)
        asked = CIMultiDict(headers)
        asked["Host"] = route.host
        asked[FROM_CHILD_HEADER] = "1"
        parent_url = str(self.parent) + route.path_qs
        try:
            response = await self.client.request(method, parent_url, headers=asked, data=data,
                                                 what=f"parent {self.parent} for {route.host}", timeout=self._timeout,
                                                 interim=interim)
        except OriginError as e:
            # Refused or unroutable: no connection was made, so no byte of a body was read.
            connected = not isinstance(e.__cause__, aiohttp.ClientConnectorError)
            self._health.failed(self._clock())
            reason = ParentFallback.TIMEOUT if isinstance(e, OriginTimeout) else ParentFallback.UNREACHABLE
            if not may_retry_on_origin(has_body=data is not None, connected=connected):
                raise
            self._fell_back(reason, route, str(e))
            return await self.client.request(method, url, headers=headers, what=what, data=data, interim=interim)
        self._health.answered()
        reason = answer_fallback(response.status, response.headers.get(CACHE_HEADER))
        if reason is None or not may_retry_on_origin(has_body=data is not None, connected=True):
            return response
        response.release()
        self._fell_back(reason, route, f"it answered {response.status}")
        return await self.client.request(method, url, headers=headers, what=what, data=data, interim=interim)

    def received_from_parent(self, n: int) -> None:
        """Body bytes of a pass-through answer the parent sent (nezha_bytes_from_parent)."""
        self._metrics.bytes_from_parent.inc(n)

    def broke_off(self, route: Target | None, offset: int, error: BaseException) -> None:
        """The parent's answer ended after `offset` body bytes; the fill asks the origin for the rest."""
        if route is not None:
            self._fell_back(ParentFallback.BROKEN, route, f"after {offset} bytes: {type(error).__name__}: {error}")

    def _fell_back(self, reason: ParentFallback, route: Target, why: str) -> None:
        self._metrics.parent_fallbacks.labels(reason=reason.value).inc()
        # While the parent is known down every miss says so: counted, logged
        # at debug; the failure itself is a warning once per RECHECK_AFTER.
        emit = log.debug if reason is ParentFallback.DOWN else log.warning
        emit("parent_fallback", reason=reason.value, parent=str(self.parent), host=route.host,
             path=redact_url(route.path_qs)[:300], error=why[:300])
