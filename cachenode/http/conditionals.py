"""Conditional and Range requests against a stored object. Pure: no I/O.

`evaluate()` turns request headers and the object's validators into one
outcome the handler dispatches on, the way aiohttp's FileResponse does.
`preconditions()` is its first half, which needs no size: it also judges
objects still streaming from the origin with no Content-Length.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from cachenode.http.fields import http_date


class Outcome(enum.Enum):
    FULL = 200
    PARTIAL = 206
    NOT_MODIFIED = 304
    PRECONDITION_FAILED = 412
    UNSATISFIABLE = 416


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    start: int = 0
    length: int = 0  # bytes to send


def _etags(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def _weak_match(a: str, b: str) -> bool:
    return a.removeprefix("W/") == b.removeprefix("W/")


def parse_range(value: str, size: int) -> tuple[int, int] | None | bool:
    """One byte range -> (start, length); None to ignore the header; False if unsatisfiable.

    Several ranges are answered with the whole object (RFC 9110 §14.2 lets a
    server ignore Range), which keeps every response a single sendfile.
    """
    unit, _, spec = value.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, sep, last = spec.strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":
            suffix = int(last)
            if suffix <= 0:
                return False
            start = max(0, size - suffix)
            return (start, size - start) if size > 0 else False
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start < 0 or (last and end < start):
        return None
    if start >= size:
        return False
    end = min(end, size - 1)
    return start, end - start + 1


def preconditions(headers: Mapping[str, str], *, etag: str | None, last_modified: str | None) -> Outcome | None:
    """NOT_MODIFIED, PRECONDITION_FAILED or None (go on), in RFC 9110 §13.2.2 order:
    If-Match, If-Unmodified-Since, If-None-Match, If-Modified-Since.

    Needs no size, so an object still arriving with no known length is judged
    the same way as a stored one.
    """
    def lm_at() -> float | None:  # parsed only when a date validator is asked for: most requests carry none
        return http_date(last_modified)

    if_match = headers.get("If-Match")
    if if_match is not None:
        tags = _etags(if_match)
        if "*" not in tags and not (etag and not etag.startswith("W/") and etag in tags):
            return Outcome.PRECONDITION_FAILED
    else:
        ius = http_date(headers.get("If-Unmodified-Since"))
        if ius is not None and (lm := lm_at()) is not None and lm > ius:
            return Outcome.PRECONDITION_FAILED
    inm = headers.get("If-None-Match")
    if inm is not None:
        tags = _etags(inm)
        if "*" in tags or (etag and any(_weak_match(etag, t) for t in tags)):
            return Outcome.NOT_MODIFIED
    else:
        ims = http_date(headers.get("If-Modified-Since"))
        if ims is not None and (lm := lm_at()) is not None and lm <= ims:
            return Outcome.NOT_MODIFIED
    return None


def if_range_applies(value: str, *, etag: str | None, last_modified: str | None) -> bool:
    """Whether an If-Range lets its Range apply (RFC 9110 §13.1.5): a strong
    ETag equal to the object's, or a date equal to its Last-Modified; any
    other makes the answer the whole object. One rule, so the fast path
    (cachenode/front/fastpath.py) and `evaluate` cannot disagree."""
    value = value.strip()
    if value.startswith('"') or value.startswith("W/"):
        return etag is not None and not etag.startswith("W/") and value == etag
    ir = http_date(value)
    return ir is not None and (lm := http_date(last_modified)) is not None and lm == ir


def evaluate(headers: Mapping[str, str], *, size: int, etag: str | None, last_modified: str | None) -> Decision:
    """`preconditions`, then If-Range and Range."""
    verdict = preconditions(headers, etag=etag, last_modified=last_modified)
    if verdict is not None:
        return Decision(verdict)
    rng = headers.get("Range")
    if rng is not None:
        if_range = headers.get("If-Range")
        if if_range is not None and not if_range_applies(if_range, etag=etag, last_modified=last_modified):
            return Decision(Outcome.FULL, 0, size)
        parsed = parse_range(rng, size)
        if parsed is False:
            return Decision(Outcome.UNSATISFIABLE)
        if parsed is not None:
            start, length = parsed
            return Decision(Outcome.PARTIAL, start, length)
    return Decision(Outcome.FULL, 0, size)
