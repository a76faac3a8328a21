"""What a leader knows of a source's answer: the facts `fill/lead.py`
decides on, read from the response (`answer_of`), and those facts with the
decision (`Judged`), which the fill engine (cachenode/fill/engine.py) acts on.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import aiohttp

from cachenode.fill.flights import Source
from cachenode.fill.lead import Answer, Decision
from cachenode.http.freshness import Policy
from cachenode.http.headers import Pairs, header_bytes
from nezha.wire import CACHE_HEADER, CacheOutcome


@dataclasses.dataclass(frozen=True)
class Judged:
    """The facts about a source's answer that the leader acts on, and `fill/lead.py`'s decision."""

    now: float
    authorize: bool  # an `authorize` origin's object: each read is the origin's to allow
    policy: Policy
    expires_at: float
    kept: Pairs  # the fields stored with the object
    vary: tuple[str, ...] | None
    chunk_size: int | None  # stored as chunks of this size across the ring; None: whole
    length: int
    age: float
    decision: Decision


def answer_of(response: aiohttp.ClientResponse, *, policy: Policy, vary: tuple[str, ...] | None, kept: Pairs,
              source: Source, fits: Callable[[int], bool], authorize: bool = False, status: int | None = None,
              length: int | None = None) -> Answer:
    """The facts about `response` that `fill/lead.py` decides on; `status` and
    `length`: those of the whole object a 206 is part of, in its stead."""
    length = response.content_length if length is None else length
    return Answer(status=response.status if status is None else status, policy=policy, vary=vary,
                  vary_listed=", ".join(response.headers.getall("Vary", [])),
                  has_validator="ETag" in response.headers or "Last-Modified" in response.headers,
                  fits=length is None or fits(length), length=length,
                  header_bytes=header_bytes(kept), from_peer=source.peer is not None,
                  peer_says_hit=response.headers.get(CACHE_HEADER) == CacheOutcome.HIT,
                  authorized_reads=authorize, has_etag="ETag" in response.headers)
