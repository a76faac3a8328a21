"""What a leader knows of a source's answer: the facts `fill/lead.py`
decides on, read from the response (`answer_of`), and those facts with the
decision (`Judged`, made by `judge`), which the fill engine
(cachenode/fill/engine.py) acts on, and a follower's lead
(cachenode/workers/follower_leads.py) too: one judgement for both, so a
follower stores exactly what the primary would.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import aiohttp

from cachenode.fill.flights import Source
from cachenode.fill.lead import Answer, Decision, decide
from cachenode.fill.origin import Answered, fields_of
from cachenode.http.fields import FieldLines, field_value
from cachenode.http.freshness import Policy, current_age, may_serve_stale_on_error, response_policy
from cachenode.http.headers import Pairs, header_bytes, stored_pairs, with_date
from cachenode.http.vary import vary_names
from cachenode.store.objects import Meta
from nezha.config import Origin
from nezha.frozen import quick_init
from nezha.wire import AUTHORIZE_HEADER, CACHE_HEADER, EXPIRES_HEADER, CacheOutcome


@quick_init
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


def answer_of(response: aiohttp.ClientResponse | Answered, *, policy: Policy, vary: tuple[str, ...] | None, kept: Pairs,
              source: Source, fits: Callable[[int], bool], authorize: bool = False, status: int | None = None,
              length: int | None = None, fields: FieldLines | None = None) -> Answer:
    """The facts about `response` that `fill/lead.py` decides on; `status` and
    `length`: those of the whole object a 206 is part of, in its stead.
    `fields`: its fields as `fields_of` reads them, when the caller has them."""
    fields = fields_of(response) if fields is None else fields
    length = response.content_length if length is None else length
    has_etag = "ETag" in fields
    return Answer(status=response.status if status is None else status, policy=policy, vary=vary,
                  vary_listed=field_value(fields, "Vary") or "",
                  has_validator=has_etag or "Last-Modified" in fields,
                  fits=length is None or fits(length), length=length,
                  header_bytes=header_bytes(kept), from_peer=source.peer is not None,
                  peer_says_hit=fields.get(CACHE_HEADER) == CacheOutcome.HIT,
                  authorized_reads=authorize, has_etag=has_etag)


def judge(response: aiohttp.ClientResponse | Answered, *, origin: Origin, source: Source, stale: Meta | None,
          now: float, fits: Callable[[int], bool],
          chunking: Callable[[tuple[str, ...] | None, bool], tuple[int | None, int]]) -> Judged:
    """What a leader makes of the source's answer: the facts about it and
    `fill/lead.py`'s decision on them. `chunking(vary, authorize)`: the chunk
    size to store it in across the ring and its length (fill/chunking.py)."""
    # A peer's copy of an `authorize` origin's object stays one, whatever this node's table says.
    authorize = origin.credentials == "authorize" or (
        source.peer is not None and response.headers.get(AUTHORIZE_HEADER) == "1")
    fields = fields_of(response)  # its names lowercased once, for every reading below and its digest check
    age = current_age(fields, now) if source.peer is None else None  # a peer's copy is stored with Age 0
    policy = response_policy(response.status, fields, now=now, policy_ttl=origin.default_ttl,
                             private_ok=authorize, targeted=origin.targeted_cache_control, age=age)
    expires_at = now + policy.ttl
    kept = with_date(stored_pairs(fields), now)
    names = vary_names(fields)
    chunk_size, length = chunking(names, authorize)
    decision = decide(answer_of(response, policy=policy, vary=names, kept=kept, source=source,
                                # Capacity is per chunk: a chunked object fits whatever its size.
                                fits=fits if chunk_size is None else lambda _: True,
                                authorize=authorize, fields=fields),
                      stale_held=stale is not None, stale_usable_on_error=stale is not None and (
                          may_serve_stale_on_error(now=now, expires_at=stale.expires_at,
                                                   stale_if_error=stale.stale_if_error)))
    if source.peer is not None:
        try:
            expires_at = float(response.headers.get(EXPIRES_HEADER, expires_at))
        except ValueError:
            pass
    return Judged(now=now, authorize=authorize, policy=policy, expires_at=expires_at, kept=kept, vary=names,
                  chunk_size=chunk_size, length=length, age=0.0 if age is None else age, decision=decision)
