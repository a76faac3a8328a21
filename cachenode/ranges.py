"""Conditional and Range requests against a stored object. Pure: no I/O.

`evaluate()` turns request headers and the object's validators into one
outcome the handler dispatches on, the way aiohttp's FileResponse does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from cachenode.freshness import http_date


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


def evaluate(headers: Mapping[str, str], *, size: int, etag: str | None, last_modified: str | None) -> Decision:
    """RFC 9110 §13.2.2 order: If-Match, If-Unmodified-Since, If-None-Match,
    If-Modified-Since, then If-Range and Range."""
    # Parsed only when a date validator is asked for: most hits carry none.
    lm_cache: list[float | None] = []

    def lm_at() -> float | None:
        if not lm_cache:
            lm_cache.append(http_date(last_modified))
        return lm_cache[0]

    if_match = headers.get("If-Match")
    if if_match is not None:
        tags = _etags(if_match)
        if "*" not in tags and not (etag and not etag.startswith("W/") and etag in tags):
            return Decision(Outcome.PRECONDITION_FAILED)
    else:
        ius = http_date(headers.get("If-Unmodified-Since"))
        if ius is not None and (lm := lm_at()) is not None and lm > ius:
            return Decision(Outcome.PRECONDITION_FAILED)
    inm = headers.get("If-None-Match")
    if inm is not None:
        tags = _etags(inm)
        if "*" in tags or (etag and any(_weak_match(etag, t) for t in tags)):
            return Decision(Outcome.NOT_MODIFIED)
    else:
        ims = http_date(headers.get("If-Modified-Since"))
        if ims is not None and (lm := lm_at()) is not None and lm <= ims:
            return Decision(Outcome.NOT_MODIFIED)
    rng = headers.get("Range")
    if rng is not None:
        if_range = headers.get("If-Range")
        if if_range is not None:
            if_range = if_range.strip()
            if if_range.startswith('"') or if_range.startswith("W/"):
                applies = etag is not None and not etag.startswith("W/") and if_range == etag
            else:
                ir = http_date(if_range)
                applies = ir is not None and (lm := lm_at()) is not None and lm == ir
            if not applies:
                return Decision(Outcome.FULL, 0, size)
        parsed = parse_range(rng, size)
        if parsed is False:
            return Decision(Outcome.UNSATISFIABLE)
        if parsed is not None:
            start, length = parsed
            return Decision(Outcome.PARTIAL, start, length)
    return Decision(Outcome.FULL, 0, size)
