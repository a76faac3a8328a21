"""A body-less GET written straight onto a pooled connection: the request
path of the node's origin client (fill/origin.py `OriginClient.request`)
for the requests that make up a dataset's first epoch.

Why: per request, aiohttp's `ClientSession.request` builds a `ClientRequest`
(URL, auth, cookie, proxy and body checks), a `StreamWriter`, its trace and
middleware hooks and a retry loop around them, then serialises a few lines
of fields: about a tenth of the event loop's time in a cold 16 KiB fill
(docs/benchmarks.md, "A cold small fill's origin request written by the
node"). Here the node writes those bytes itself, and keeps every part of
aiohttp that is not per-request bookkeeping:

- the connection comes from the session's own connector (`connect`): one
  pool and its limit, the wait for a free connection, keep-alive reuse, the
  connect and TLS handshake with certificate verification, and their errors;
- the answer is aiohttp's own `ClientResponse` (the origin client's
  `InterimResponse`) read by aiohttp's `ResponseHandler` (its C parser, 1xx
  answers, the sock_read timeout), so a fill that streams, splices, passes
  on or closes its answer unread gets the object a session would have given it.

What it must keep of `ClientSession.request(..., allow_redirects=False)` with
the origin client's session (no cookie jar, no User-Agent, no
Accept-Encoding), each held by tests/integration/cachenode/test_plain_get.py:
the request head byte for byte (`request_head`), one retry on a new
connection when the one used turns out closed or broken (RFC 9112 §9.3.1: a
GET is idempotent and has no body to resend; never after a failed connect),
and the same exceptions for the same failures. Anything else (a body,
credentials in the URL, a total timeout) goes through the session. It leans
on aiohttp's internals (`ClientResponse`'s constructor, `ClientRequest` as the
connector's key, `set_response_params`, the header serialiser): those tests
fail if a new aiohttp moves them.
"""

from __future__ import annotations

import asyncio
import re
from typing import Mapping

from aiohttp import ClientResponse, ClientSession, ClientTimeout, hdrs
from aiohttp.client_exceptions import (ClientConnectionResetError, ClientConnectorError, ClientError, ClientOSError,
                                       ConnectionTimeoutError, ServerDisconnectedError)
from aiohttp.client_reqrep import ClientRequest, RequestInfo
from aiohttp.helpers import TimerNoop
from aiohttp.http_writer import _serialize_headers
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy
from yarl import URL

from nezha.memo import keep

_TEMPLATES_MAX = 1024  # (scheme, host, port, verification) kept; cleared when full


def plain(url: URL, timeout: ClientTimeout) -> bool:
    """Whether a GET of `url` with `timeout` can go through `PlainGets`: a
    URL with a host and no credentials in it (a session turns those into
    Authorization), of http or https, and no total timeout (a session
    bounds the whole exchange with it)."""
    return timeout.total is None and _plain_where(url)


def _plain_where(url: URL) -> bool:
    """`plain`'s part that only the URL's scheme and authority decide."""
    return url.scheme in ("http", "https") and bool(url.raw_host) and url.raw_user is None and url.raw_password is None


def request_fields(url: URL, headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The fields a session sends with a GET of `url` with `headers` and the
    origin client's settings: Host first (the URL's, or the caller's in its
    place), the caller's fields in order, then Accept: */* unless the caller
    sent an Accept. The same steps as `ClientSession._prepare_headers` and
    `ClientRequest.update_headers` / `update_auto_headers`, so a name the
    caller spelt two ways comes out as a session would send it."""
    merged: CIMultiDict[str] = CIMultiDict()
    if headers:
        items = headers.items() if isinstance(headers, (MultiDict, MultiDictProxy)) else CIMultiDict(headers).items()
        added: set[str] = set()
        for name, value in items:
            if name in added:
                merged.add(name, value)
            else:
                merged[name] = value
                added.add(name)
    fields: CIMultiDict[str] = CIMultiDict()
    host = url.host_port_subcomponent
    assert host is not None
    fields[hdrs.HOST] = host
    for name, value in merged.items():
        if name in hdrs.HOST_ALL:
            fields[name] = value
        else:
            fields.add(name, value)
    if hdrs.ACCEPT not in fields:
        fields[hdrs.ACCEPT] = "*/*"
    return fields


def request_head(url: URL, fields: CIMultiDict[str]) -> bytes:
    """The request line and `fields`, serialised by aiohttp's own writer
    (which refuses a control character in any of them): the target as the
    URL spells it, HTTP/1.1."""
    return _serialize_headers(f"GET {url.raw_path_qs} HTTP/1.1", fields)


# (authority, fields) -> what a body-less GET of an http:// URL with that
# authority and those fields sends besides its request line (`plain_request`):
# (host, port, the fields' bytes), or None when it is not `plain`.
_WHERE: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, int, bytes] | None] = {}
_WHERE_MAX = 1024  # remembered; cleared when full
# Longer (authority and fields) are worked out every time: with the bound above, at most
# about 2 MiB remembered whatever clients send (a User-Agent new on every request).
_WHERE_ENTRY_MAX = 2048
_UNSEEN = object()  # `_WHERE.get`'s answer for a key not there (None is an entry's value): one look-up, not two


def plain_request(url: str, fields: Mapping[str, str], timeout: ClientTimeout) -> tuple[str, int, bytes] | None:
    """(host, port, head) of a GET of `url` (as `URL(url, encoded=True)`
    reads it) with `fields`, the head `request_head` writes with
    `request_fields`, when `plain` holds and the URL names a port; None
    otherwise. Raises what they raise.

    Why: a cold small fill's request differs from the last one to its
    origin only in its target, yet yarl's parse of the URL and the fields'
    merge and serialisation cost a few microseconds each time. So what an
    http:// URL's authority and the fields decide is remembered, and a
    target yarl keeps as it is spelt (`_AS_SPELT`) is written as the
    request line itself. Any other URL is read by yarl each time."""
    spelt = _AS_SPELT.fullmatch(url)
    if timeout.total is not None or spelt is None or url[-1] == "?":
        asked = URL(url, encoded=True)
        if not plain(asked, timeout) or asked.raw_host is None or asked.port is None:
            return None
        return asked.raw_host, asked.port, request_head(asked, request_fields(asked, fields))
    authority, target = spelt.groups()
    key = (authority, tuple(fields.items()))
    where = _WHERE.get(key, _UNSEEN)
    if where is _UNSEEN:
        asked = URL(url, encoded=True)  # its authority's parse is that of any URL with it: yarl splits it off first
        where = None
        if _plain_where(asked) and asked.raw_host is not None and asked.port is not None:
            # The fields as `request_head` writes them after its request line (whose CRLF is left out).
            where = asked.raw_host, asked.port, _serialize_headers("", request_fields(asked, fields))[2:]
        size = len(authority) + sum(len(n) + len(v) for n, v in key[1])
        keep(_WHERE, key, where, _WHERE_MAX, size, _WHERE_ENTRY_MAX)
    if where is None:
        return None
    host, port, written = where
    return host, port, b"GET %b HTTP/1.1\r\n%b" % (target.encode("ascii"), written)


# An http:// URL whose authority (up to its first "/") holds no "?" or "#", and
# whose path and query (from that "/") yarl reads to the `raw_path_qs` they
# spell, which `_serialize_headers` writes as their ASCII bytes: with
# `encoded=True` yarl neither quotes nor normalises a path, but it drops a
# fragment, a query's lone "?" (`plain_request` checks the URL's end) and
# tabs, and aiohttp refuses a control character. So: printable ASCII but "#".
_AS_SPELT = re.compile(r"http://([^/?#]+)(/[\x20-\x22\x24-\x7e]*)")


class _Written:
    """What a `ClientResponse` reads of the request's writer once it is sent."""

    __slots__ = ("output_size",)

    def __init__(self, size: int) -> None:
        self.output_size = size


class PlainGets:
    """Body-less GETs on `session`'s connector, answered as `response_class`."""

    def __init__(self, session: ClientSession, *, response_class: type[ClientResponse], read_bufsize: int) -> None:
        self._session = session
        self._response_class = response_class
        self._read_bufsize = read_bufsize
        # A request per (scheme, host, port, verification), that the connector
        # keys, opens and verifies connections by; never sent itself.
        self._templates: dict[tuple[str, str, int | None, object], ClientRequest] = {}

    def _template(self, url: URL, verify: object) -> ClientRequest:
        where = (url.scheme, url.raw_host or "", url.port, verify)
        template = self._templates.get(where)
        if template is None:
            template = ClientRequest("GET", url.origin(), loop=asyncio.get_running_loop(), session=self._session,
                                     ssl=verify)
            keep(self._templates, where, template, _TEMPLATES_MAX)
        return template

    async def get(self, url: URL, headers: Mapping[str, str], *, timeout: ClientTimeout,
                  verify: object = True) -> ClientResponse:
        """The answer to `GET url` once its head is in (`plain(url, timeout)`
        must hold); the caller releases it. Raises what a session raises."""
        if self._session.closed:
            raise RuntimeError("Session is closed")
        fields = request_fields(url, headers)
        head = request_head(url, fields)
        template = self._template(url, verify)
        retry = True
        while True:
            try:
                return await self._exchange(url, template, head, fields, timeout)
            except ClientConnectorError:
                raise  # nothing was sent: a failed connect is not retried (the certificate's and TLS errors too)
            except (ClientOSError, ServerDisconnectedError):
                if not retry:
                    raise
                retry = False  # a kept-alive connection the origin had closed: once more, on another
            except ClientError:
                raise
            except OSError as e:
                if e.errno is None and isinstance(e, asyncio.TimeoutError):
                    raise
                raise ClientOSError(*e.args) from e

    async def _exchange(self, url: URL, template: ClientRequest, head: bytes, fields: CIMultiDict[str],
                        timeout: ClientTimeout) -> ClientResponse:
        """One try: a connection from the pool (or a new one), the head
        written, the answer's head read; the connection closed on any failure."""
        connector = self._session.connector
        assert connector is not None
        try:
            conn = await connector.connect(template, traces=[], timeout=timeout)
        except asyncio.TimeoutError as e:
            raise ConnectionTimeoutError(f"Connection timeout to host {url}") from e
        protocol = conn.protocol
        assert protocol is not None
        timer = TimerNoop()
        protocol.set_response_params(timer=timer, read_until_eof=True, auto_decompress=False,
                                     read_timeout=timeout.sock_read, read_bufsize=self._read_bufsize)
        try:
            transport = protocol.transport
            if transport is None or transport.is_closing():
                raise ClientConnectionResetError("Cannot write to closing transport")
            transport.write(head)
            protocol.start_timeout()
            response = self._response_class(
                "GET", url, writer=None, continue100=None, timer=timer,
                request_info=RequestInfo(url, "GET", CIMultiDictProxy(fields), url), traces=[],
                loop=asyncio.get_running_loop(), session=self._session, stream_writer=_Written(len(head)))
            try:
                await response.start(conn)
            except BaseException:
                response.close()
                raise
        except BaseException:
            conn.close()
            raise
        return response
