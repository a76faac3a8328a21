"""What a plain request is, and the heads a plain hit gets: the fast path's
judging half, with no I/O (cachenode/front/fastpath.py holds the connection
that uses it).

A plain request is HTTP/1.1 GET or HEAD with a short allow-list of
headers, keep-alive, at most one byte range (`parse_plain`); anything else
is aiohttp's to parse. The verdict on a head depends on its bytes alone, so
heads seen before are remembered (`plain_request`), and the field lines of
heads not seen before, bounded in count and size. The 200 head of a stored
object (`response_head`) and the 206 head made from it (`partial_head`) are
built once per object, as the handler would send them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cachenode.front.exact_head import encode_lines
from cachenode.http.conditionals import if_range_applies, parse_range
from cachenode.http.fields import imf_fixdate
from cachenode.http.headers import describes_whole_body
from cachenode.store.objects import Meta
from nezha.frozen import quick_init
from nezha.memo import keep
from nezha.wire import CACHE_HEADER, FROM_CHILD_HEADER, SERVED_BY_HEADER, CacheOutcome

MAX_HEAD = 8192
# Headers a plain hit may carry; any other sends the request to aiohttp.
ALLOWED = frozenset({"host", "user-agent", "accept", "accept-encoding", "connection", "range", "if-range"})
# A child node's request (a sidecar asking its parent tier, docs/cache-node.md
# "A parent tier") carries its marker and Via: neither changes what a hit is,
# so a parent serves its children's hits here too. Via alone is the handler's
# (a request that came back through this node is a loop, answered 508).
_FROM_CHILD = FROM_CHILD_HEADER.lower()
CHILD_ALLOWED = frozenset({_FROM_CHILD, "via"})
# One range in the form every client sends; any other (several ranges, another
# unit, spaces, a number too long to be a file offset) is the handler's to judge.
_ONE_RANGE = re.compile(r"bytes=(?:[0-9]{1,18}-[0-9]{0,18}|-[0-9]{1,18})")
# A Range line of that form, found in a head's bytes without parsing it.
_RANGE_LINE = re.compile(rb"\r\n[Rr][Aa][Nn][Gg][Ee]:[ \t]*(bytes=(?:[0-9]{1,18}-[0-9]{0,18}|-[0-9]{1,18}))[ \t]*\r\n")
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@quick_init  # one is made for every request head not seen before (each of a cold epoch's)
@dataclass(frozen=True)
class PlainRequest:
    method: str
    target: str
    host: str
    size: int  # bytes of the request head, blank line included
    range: str | None = None  # one byte range, `bytes=a-b`, `bytes=a-` or `bytes=-n`
    if_range: str | None = None


def parse_plain(buf: bytes | bytearray) -> PlainRequest | None | bool:
    """The request at the start of `buf` if it is plain; None if more bytes are
    needed; False if it is not plain (aiohttp must parse it). Pure.

    A line ended by a bare LF is never plain: waiting for a CRLF CRLF that
    never comes held such clients for an hour, while aiohttp answers them 400
    at once (RFC 9112 §2.2 lets a server refuse bare LF)."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        if _bare_lf(buf[:MAX_HEAD]):
            return False
        return None if len(buf) < MAX_HEAD else False
    return _judged(buf, end)


def _bare_lf(raw: bytes | bytearray) -> bool:
    return raw.count(b"\n") != raw.count(b"\r\n")


# A plain request line and its CRLF: GET or HEAD, one space, a target of
# ASCII characters but space and LF, one space, HTTP/1.1. As the target can
# hold neither LF nor space, its CRLF is the head's first, and the line is
# what splits at single spaces into those three parts.
_REQUEST_LINE = re.compile(rb"(GET|HEAD) ([^ \n\x80-\xff]+) HTTP/1\.1\r\n")


def _request_line(head: bytes | bytearray, end: int) -> re.Match | None:
    """The plain request line at the start of `head` (read up to `end`,
    which includes its CRLF); None: not plain. One regular expression: a
    cold epoch judges a request line per request."""
    return _REQUEST_LINE.match(head, 0, end)


def _asked(line: re.Match) -> tuple[str, str]:
    """The method and target of a plain request line (`_request_line`)."""
    return ("GET" if line.end(1) == 3 else "HEAD"), line.group(2).decode("ascii")


def _fields(fields: str) -> tuple[str, str | None, str | None] | bool:
    """The Host, Range and If-Range of a plain request's field lines (between
    its request line and its blank line); False: they make it not plain."""
    host = rng = if_range = None
    child = set()
    for line in fields.split("\r\n") if fields else ():
        name, sep, value = line.partition(":")
        if not sep or not name or not _TOKEN.issuperset(name):
            return False  # also folded lines, which start with a space
        lname = name.lower()
        if lname in CHILD_ALLOWED:
            if lname in child:
                return False
            child.add(lname)
        elif lname not in ALLOWED:
            return False
        value = value.strip(" \t")
        if not value.isprintable():
            return False
        if lname == "host":
            if host is not None:
                return False
            host = value
        elif lname == "connection" and value.lower() != "keep-alive":
            return False
        elif lname == "range":
            if rng is not None or not _ONE_RANGE.fullmatch(value):
                return False
            rng = value
        elif lname == "if-range":
            if if_range is not None:
                return False
            if_range = value
    if not host or (child and _FROM_CHILD not in child):
        return False
    return host, rng, if_range


# Request heads already judged by parse_plain, by their exact bytes: clients
# send the same few heads again and again (one per object they read), and
# judging one costs more than the rest of a hit's Python. Bounded in count
# (cleared when full) and in size (longer heads are judged every time), so
# it (and _JUDGED_RANGED below, likewise) holds at most 4 MiB whatever clients send. A head's verdict depends on
# its bytes alone, so a stale entry cannot exist.
# A ranged read's head differs from the last one only in its range, so it is
# remembered without the range's value, in a memo of its own (_JUDGED_RANGED):
# a head of one object read in a thousand ranges is one entry, not a thousand
# that push out every other. That is exact because parse_plain's verdict does
# not depend on a range of the form _RANGE_LINE finds (any such value passes
# _ONE_RANGE); the value and the head's length are the request's own. Its own
# memo, because a head with its range cut out is a head too (`Range: ` with
# no value), whose verdict is another.
# A head not seen before (a cold epoch asks each path once) has its field
# lines judged once per block of them (_FIELDS, _FIELDS_RANGED, likewise):
# clients send the same few blocks with every path. A block starts at the
# CRLF that ends the request line, as the head's verdict depends on the
# request line and the block alone (one of them not plain, nor is the head).
_JUDGED: dict[bytes, PlainRequest | bool] = {}
_JUDGED_RANGED: dict[bytes, PlainRequest | bool] = {}
_FIELDS: dict[bytes, tuple[str, str | None, str | None] | bool] = {}
_FIELDS_RANGED: dict[bytes, tuple[str, str | None, str | None] | bool] = {}
_JUDGED_MAX = 4096
_JUDGED_HEAD_MAX = 1024  # wget, curl and the SDKs send a few hundred bytes


def plain_request(buf: bytearray) -> PlainRequest | None | bool:
    """`parse_plain(buf)`, remembered for heads seen before."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        return parse_plain(buf)
    if end + 4 > _JUDGED_HEAD_MAX:
        return parse_plain(buf)
    head = bytes(buf[:end + 4])
    ranged = _RANGE_LINE.search(head)
    if ranged is None:
        judged, memo, blocks = _JUDGED, head, _FIELDS
    else:
        judged, memo, blocks = _JUDGED_RANGED, head[:ranged.start(1)] + head[ranged.end(1):], _FIELDS_RANGED
    verdict = judged.get(memo)
    if verdict is None:
        # A verdict is never None (the head is complete): a miss of `get` is an unseen head.
        verdict = keep(judged, memo, _judged(head, end, memo, blocks), _JUDGED_MAX)
    if ranged is None or verdict is False:
        return verdict
    return PlainRequest(verdict.method, verdict.target, verdict.host, end + 4,
                        ranged.group(1).decode("ascii"), verdict.if_range)


def _judged(head: bytes | bytearray, end: int, memo: bytes | None = None,
            blocks: dict | None = None) -> PlainRequest | bool:
    """The verdict on a whole head (`end`: where its blank line starts): its
    request line (`_request_line`, which takes no LF and no byte past ASCII)
    and its field lines (ASCII, no bare LF, `_fields`). With `blocks`, the
    field lines are judged once per block there, the block as `memo` (the
    head as `plain_request` remembers it) holds it."""
    asked = _request_line(head, end + 2)
    if asked is None:
        return False
    cut = asked.end() - 2  # the request line's end: the range, if cut out of `memo`, is after it
    block = None if blocks is None or memo is None else memo[cut:]
    fields = None if block is None else blocks.get(block)  # type: ignore[union-attr]
    if fields is None:
        raw = head[cut + 2:end]
        fields = False if _bare_lf(raw) or not raw.isascii() else _fields(raw.decode("ascii"))
        if block is not None:
            keep(blocks, block, fields, _JUDGED_MAX)  # type: ignore[arg-type]
    if fields is False:
        return False
    return PlainRequest(*_asked(asked), fields[0], end + 4, fields[1], fields[2])

def one_plain_request(buf: bytearray) -> bool:
    """Whether `buf` holds one whole plain request head and not a byte more.
    Such a request has no body (`parse_plain` lets no Content-Length or
    Transfer-Encoding through), so a parser that has read it holds nothing."""
    req = plain_request(buf)
    return isinstance(req, PlainRequest) and req.size == len(buf)


def wanted_range(req: PlainRequest, meta: Meta) -> tuple[int, int] | None | bool:
    """(offset, length) of the one range a plain request asks of `meta`; None
    for the whole object (no Range, or an If-Range that does not apply); False
    when the handler must answer (a range it would refuse or ignore). Pure.

    As `conditionals.evaluate`, which the handler's answer follows."""
    if req.range is None:
        return None
    if req.if_range is not None and not if_range_applies(req.if_range, etag=meta.etag,
                                                         last_modified=meta.last_modified):
        return None
    parsed = parse_range(req.range, meta.size)
    if parsed is None or parsed is False:
        return False  # bytes=5-3 (ignored: the whole object), or none satisfiable (416)
    return parsed


def response_head(meta: Meta, *, via: str, served_by: str | None = None, label: CacheOutcome | None = None) -> bytes:
    """Status line and headers of a 200 for `meta`, as the handler would send
    them (cachenode/front/respond.py), without the Age line of each reuse.
    Its Date is the stored one (RFC 9110 §6.6.1): the same on every reuse.
    A hot copy says so, and names the node whose disk serves it (`served_by`).
    `label`: its X-Nezha-Cache when not a hit's (a miss the fast path led, front/fast_misses.py)."""
    lines = ["HTTP/1.1 200 OK"]
    vias: list[str] = []
    dated = ranges = False
    for k, v in meta.headers:  # one pass: each name lowercased once
        name = k.lower()
        if name == "via":
            vias.append(v)
            continue
        lines.append(f"{k}: {v}")
        if name == "date":
            dated = True
        elif name == "accept-ranges":
            ranges = True
    if not dated:  # dated as `with_date` dates a stored answer (RFC 9110 §6.6.1)
        lines.append(f"Date: {imf_fixdate(meta.stored_at)}")
    if not ranges:
        lines.append("Accept-Ranges: bytes")
    vias.append(via)
    lines.append(f"Via: {', '.join(vias)}\r\n{CACHE_HEADER}: "
                 f"{label or (CacheOutcome.HOT_HIT if meta.hot else CacheOutcome.HIT)}\r\nContent-Length: {meta.size}")
    if meta.hot and served_by is not None:
        lines.append(f"{SERVED_BY_HEADER}: {served_by}")
    lines.append("")  # each line ended; the closing blank line is left off: Age follows on each reuse
    return encode_lines(lines)


# 206 heads made from 200 heads (`partial_head`), by the 200 head: the handler
# keeps one 200 head per stored object, so this holds one entry per object
# read in ranges. Bounded like _JUDGED.
_PARTIAL_HEADS: dict[bytes, bytes] = {}
_PARTIAL_HEADS_MAX = 4096


def partial_head(head: bytes) -> bytes:
    """The head of a 206 from the head of a 200 (`response_head`, without its
    closing blank line): status 206, and without Content-Length and the fields
    that describe the whole body (`describes_whole_body`), as the handler
    leaves them off a 206. Content-Range and Content-Length are the caller's
    to add: they are each request's own."""
    made = _PARTIAL_HEADS.get(head)
    if made is None:
        lines = [b"HTTP/1.1 206 Partial Content"]
        for line in head[:-2].split(b"\r\n")[1:]:
            name = line.partition(b":")[0].decode("latin-1")
            if name.lower() != "content-length" and not describes_whole_body(name):
                lines.append(line)
        made = keep(_PARTIAL_HEADS, head, b"\r\n".join(lines) + b"\r\n", _PARTIAL_HEADS_MAX)
    return made
