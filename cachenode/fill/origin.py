"""The node's HTTP client for origins and peers.

Maps transport failures to named errors the handlers answer with: refused
or reset connections are `OriginError` (502), silence is `OriginTimeout`
(504). Only URLs built from the configured origin table reach this module.

Connections come from one pool of `limit`. With every one of them busy
(that many downloads streaming at once), a new request queues for a free
one; that wait is bounded too (`pool_timeout`), so a saturated node answers
504 naming the origin instead of leaving the client hanging.
"""

from __future__ import annotations

import asyncio
import ssl
from contextvars import ContextVar
from pathlib import Path
from types import SimpleNamespace
from typing import Awaitable, Callable, Mapping, Protocol

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from cachenode.fill.plain_get import PlainGets, plain
from cachenode.fill.small_gets import SmallAnswer
from cachenode.http.fields import FieldLines
from cachenode.http.headers import delimited_by_close, end_to_end_pairs
from nezha.wire import OWN_PREFIX
from nezha.errors import OriginError, OriginTimeout, PoolBusy


def end_to_end(headers: Mapping[str, str], *, drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    """A message's end-to-end fields (cachenode/http/headers.py), repeats and order kept, ready to send."""
    return CIMultiDict(end_to_end_pairs(headers, drop=drop))


def ends_at_close(response: aiohttp.ClientResponse) -> bool:
    """Whether this response's body is delimited only by its connection closing
    (cachenode/http/headers.py `delimited_by_close`): it can be streamed, never
    proven whole, so never stored."""
    return delimited_by_close(response.status, fields_of(response), method=response.method)


def via_of(node_id: str) -> str:
    """This node's Via entry: the protocol it received, and its name as pseudonym."""
    return f"1.1 {node_id}"


def add_via(headers: CIMultiDict[str], via: str) -> None:
    """Append this node to a message's Via (RFC 9110 §7.6.3): one list, in hop order."""
    before = headers.getall("Via", [])
    headers.popall("Via", None)
    headers["Via"] = ", ".join([*before, via])


def forwarded_request_headers(headers: Mapping[str, str], *, via: str, drop: frozenset[str] = frozenset(),
                              expect: bool = False) -> CIMultiDict[str]:
    """A client's request as the origin should see it: its end-to-end fields in
    order, without the cache's own X-Nezha-* fields, the lowercased names in
    `drop` and, unless `expect` (the origin's 100 is relayed to the client),
    Expect; this node added to Via."""
    out = end_to_end(headers, drop=drop if expect else drop | {"expect"})
    for name in [n for n in out if n.lower().startswith(OWN_PREFIX)]:
        out.popall(name, None)
    hops = out.get("Max-Forwards", "").strip()
    if hops.isdigit() and int(hops) > 0:
        out["Max-Forwards"] = str(int(hops) - 1)  # RFC 9110 §7.6.2: each hop takes one
    add_via(out, via)
    return out


# Hears an origin's interim answers: status, reason, fields (RFC 9110 §15.2).
Interim = Callable[[int, str, list[tuple[str, str]]], Awaitable[None]]
# The listener of the request `OriginClient.request` is making in this task;
# set only around that one call, so no task it spawns inherits it.
_interim: ContextVar[Interim | None] = ContextVar("nezha_interim", default=None)


class InterimResponse(aiohttp.ClientResponse):
    """aiohttp's response, which also tells the request's listener of each
    interim answer before the final one.

    aiohttp's client reads 1xx answers and drops them (a 100 only releases
    a body waiting on Expect). A 102 or 103 (Early Hints) belongs to the
    client the origin is answering, so it is heard here and forwarded;
    100 stays aiohttp's (the node relays it its own way) and 101 is a final
    answer. Nothing of an interim answer is stored.
    """

    async def start(self, connection):  # type: ignore[no-untyped-def]
        listener = _interim.get()
        protocol = connection.protocol
        if listener is None or protocol is None:
            return await super().start(connection)
        read = protocol.read

        async def read_heard():  # type: ignore[no-untyped-def]
            message, payload = await read()
            if 102 <= message.code <= 199:
                await listener(message.code, message.reason, list(message.headers.items()))
            return message, payload

        # The protocol is the pooled connection's: shadow its read for this
        # exchange only.
        protocol.read = read_heard
        try:
            return await super().start(connection)
        finally:
            del protocol.read

    _field_lines: FieldLines | None = None

    def field_lines(self) -> FieldLines:
        """Its fields read once (`fields_of`); asked only once its head is in, whose fields never change.
        Not a `functools.cached_property`, whose first read takes a lock (Python 3.11)."""
        lines = self._field_lines
        if lines is None:
            lines = self._field_lines = FieldLines(self.headers.items())
        return lines


class Answered(Protocol):
    """What a leader reads of a source's answer: aiohttp's (`InterimResponse`) or a small one read whole
    (fill/small_gets.py `SmallAnswer`)."""

    status: int
    headers: CIMultiDictProxy[str]
    content_length: int | None

    def field_lines(self) -> FieldLines: ...


def fields_of(response: aiohttp.ClientResponse | Answered) -> FieldLines:
    """`response`'s fields read once (http/fields.py `FieldLines`): kept with
    an origin's answer (`InterimResponse`, `SmallAnswer`), whose judging and
    digest check both read them; made anew for any other."""
    if isinstance(response, (InterimResponse, SmallAnswer)):
        return response.field_lines()
    return FieldLines(response.headers.items())


def certificate_problem(e: aiohttp.ClientConnectorCertificateError) -> str:
    """What was wrong with an origin's certificate, in OpenSSL's words ("certificate has expired")."""
    err = e.certificate_error
    if isinstance(err, ssl.SSLCertVerificationError) and err.verify_message:
        return err.verify_message
    return str(err)


# Whether the request `OriginClient.request` is making in this task waits for
# a free connection of the pool (`_Pool`), for the message of a timeout.
_waiting: ContextVar[SimpleNamespace | None] = ContextVar("nezha_pool_wait", default=None)


class _Pool(aiohttp.TCPConnector):
    """aiohttp's connector, telling the request waiting for one of its
    connections that it waits. aiohttp's client tracing says the same, but
    a `TraceConfig` makes every request build trace objects and await a
    signal at each step of it (a tenth of the client's Python per small
    fill, docs/benchmarks.md), for the one step this needs. The tests in
    tests/integration/cachenode/test_failed_fills.py fail if a new aiohttp
    moves that step."""

    async def _wait_for_available_connection(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        waiting = _waiting.get()
        if waiting is not None:
            waiting.queued = True
        await super()._wait_for_available_connection(*args, **kwargs)
        if waiting is not None:
            waiting.queued = False  # not when the wait timed out: that timeout is the pool's


_READ_BUFSIZE = 1 << 20


class OriginClient:
    def __init__(self, *, connect_timeout: float, read_timeout: float, limit: int = 256,
                 pool_timeout: float | None = None, roots: Mapping[tuple[str, int], Path] | None = None) -> None:
        """`pool_timeout` bounds getting a connection: the wait for a free one in
        the pool plus the connect that may follow. It defaults to as long as a
        silent origin is given (`read_timeout`) and is never below `connect_timeout`.

        `roots` names, per https:// (host, port), the PEM bundle its certificate
        must verify against instead of the system store. Verification is never
        turned off: a certificate that does not verify is an OriginError naming why.

        Names are found the system's way (getaddrinfo: /etc/hosts, then DNS).
        A sidecar's /etc/hosts is its own, which names no origin
        (docs/deployment-models.md), so its fallback reaches the real one.
        """
        if pool_timeout is None:
            pool_timeout = max(read_timeout, connect_timeout)
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout),
                            ("pool_timeout", pool_timeout)):
            if value <= 0:
                raise ValueError(f"{name} ({value!r}) must be positive")
        if pool_timeout < connect_timeout:
            raise ValueError(f"pool_timeout ({pool_timeout!r}) must be at least connect_timeout ({connect_timeout!r}): "
                             "it includes the connect")
        if limit < 1:
            raise ValueError(f"limit ({limit!r}) must be at least 1")
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._pool_timeout = pool_timeout
        # aiohttp's `connect` is the pool wait plus the connect; `sock_connect` the connect alone.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=pool_timeout,
                                              sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._gets: PlainGets | None = None
        self._limit = limit
        contexts: dict[Path, ssl.SSLContext] = {}
        self._roots = {where: contexts.setdefault(Path(bundle), ssl.create_default_context(cafile=str(bundle)))
                       for where, bundle in (roots or {}).items()}

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=_Pool(limit=self._limit, ttl_dns_cache=60),
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            read_bufsize=_READ_BUFSIZE,  # fewer, larger reads from origins and peers
            response_class=InterimResponse,
            # No cookie jar: aiohttp's default keeps every Set-Cookie an origin sends and adds it to
            # later requests to that origin, whichever client they are for: one job's session would
            # go out with every other job's requests (tests/integration/cachenode/test_origin_cookies.py).
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        # Body-less GETs skip the session's per-request machinery, on its connector (fill/plain_get.py).
        self._gets = PlainGets(self._session, response_class=InterimResponse, read_bufsize=_READ_BUFSIZE)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, url: str, *, headers: Mapping[str, str], what: str,
                      timeout: aiohttp.ClientTimeout | None = None, json: object = None,
                      data: object = None, interim: Interim | None = None) -> aiohttp.ClientResponse:
        """Send a request and return once the response headers are in.

        `what` names the thing being fetched in error messages ("origin
        http://host/path"). `interim` hears each 1xx answer but 100 and 101
        before the final one (InterimResponse). The caller must release the
        response. A GET without a body goes out through `PlainGets` on the
        session's connector (fill/plain_get.py), anything else through the
        session; the answer, its errors and their messages are the same.
        """
        assert self._session is not None, "OriginClient.start() was not awaited"
        if timeout is None:
            timeout = self._timeout
        elif timeout.connect is None and timeout.total is None:
            # A caller's own timeouts (peers) still get the bound on the pool queue.
            timeout = aiohttp.ClientTimeout(
                total=None, connect=max(self._pool_timeout, timeout.sock_connect or 0),
                sock_connect=timeout.sock_connect, sock_read=timeout.sock_read, ceil_threshold=timeout.ceil_threshold)
        waiting = SimpleNamespace(queued=False)
        verify: ssl.SSLContext | bool = True
        if self._roots and url.startswith("https://"):
            u = URL(url)
            host, port = u.host or "", u.port or 443
            verify = self._roots.get((host, port)) or self._roots.get((f"*.{host.split('.', 1)[-1]}", port), True)
        heard = _interim.set(interim)
        queue = _waiting.set(waiting)
        try:
            # encoded=True: the target goes out as the client spelt it. Parsed
            # as a plain string, yarl re-spells escapes (%27 as ', %28 as (),
            # so an owner asked through a relay would key the object apart
            # from a direct read, and a signature over the exact URL breaks.
            target = URL(url, encoded=True)
            if method == "GET" and data is None and json is None and self._gets is not None and plain(target, timeout):
                return await self._gets.get(target, headers, timeout=timeout, verify=verify)
            return await self._session.request(
                method, target, headers=headers, allow_redirects=False, timeout=timeout, json=json, data=data,
                ssl=verify)
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as e:
            if waiting.queued:  # the bound is `connect` (pool wait and connect), or `total` for a probe's
                bound = timeout.connect if timeout.connect is not None else timeout.total
                raise PoolBusy(
                    f"{what}: no free connection within {bound:g}s: all {self._limit} connections "
                    f"of this node's origin pool are busy") from e
            raise OriginTimeout(f"{what}: no answer within the timeout "
                                f"(connect {self._connect_timeout:g}s, read {self._read_timeout:g}s)") from e
        except aiohttp.ClientConnectorCertificateError as e:
            raise OriginError(f"{what}: its TLS certificate does not verify: {certificate_problem(e)}") from e
        except aiohttp.ClientConnectorSSLError as e:
            raise OriginError(f"{what}: TLS handshake failed: {e.os_error}") from e
        except aiohttp.ClientConnectorError as e:
            raise OriginError(f"{what}: cannot connect: {e.os_error or e}") from e
        except aiohttp.ClientError as e:
            raise OriginError(f"{what}: {type(e).__name__}: {e}") from e
        except OSError as e:
            raise OriginError(f"{what}: {e}") from e
        finally:
            _waiting.reset(queue)
            _interim.reset(heard)
