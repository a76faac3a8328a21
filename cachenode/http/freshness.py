"""What may be stored, for how long, and when a stored copy may be reused
(RFC 9111, RFC 5861). Pure: no I/O.

A shared cache stores a response only when nothing in it or its request
says the response belongs to one client. Anything doubtful is passed through.

Two halves. `response_policy()` runs once, when a response arrives, and
turns its status and headers into a `Policy`: storable or not, a TTL, and
how long past expiry the copy may still answer. `judge()` runs on every hit
and weighs that stored policy against the request's own directives
(`request_directives()`), returning a `Use` the handler dispatches on.

Header arguments are any `Mapping[str, str]`: a plain dict in any
capitalisation, or a case-insensitive multidict carrying repeated fields.
Every lookup goes through `field_value()` (http/fields.py), so two `Cache-Control` lines
count as one list (RFC 9110 §5.3) everywhere.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import Mapping

from cachenode.http.fields import delta_seconds, field_value, http_date, parse_cache_control, split_list
from cachenode.http.targeted import targeted_directives
from nezha.frozen import quick_init

HEURISTIC_STATUSES: frozenset[int] = frozenset({200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501})
# The lifetime given a response with Last-Modified but no explicit one, when
# the operator set no per-origin policy (RFC 9111 §4.2.2 leaves the heuristic
# to the cache). Not the 10 % of its age that §4.2.2 suggests: dataset files
# are written once, and a file an origin made a minute ago would otherwise be
# revalidated on every read for its first hours.
HEURISTIC_TTL: float = 3600.0
# Statuses this cache may store at all: the heuristically cacheable ones.
# 206 never: this cache keeps only complete responses (RFC 9111 §3.3 lets it
# decline to combine partial ones), and serves ranges from them itself.
STORED_STATUSES: frozenset[int] = HEURISTIC_STATUSES

# Request fields that carry a client's credentials (RFC 9110 §11.6.2 and
# the token headers of S3, OpenStack Swift, GitLab, Google and API gateways).
CREDENTIAL_FIELDS = ("Authorization", "Cookie", "X-Amz-Security-Token", "X-Auth-Token", "X-Storage-Token",
                     "Private-Token", "Job-Token", "X-Api-Key", "X-Goog-Api-Key", "Api-Key")
_CREDENTIALS_LOWER = frozenset(name.lower() for name in CREDENTIAL_FIELDS)


def request_bypasses_cache(headers: Mapping[str, str]) -> str | None:
    """Why a request must go straight to the origin, or None.

    Credentials make a response one client's own; neither serving it from
    the cache nor storing it is ever right (RFC 9111 §3.5). Beyond
    Authorization and Cookie, the fields that object stores and APIs take
    tokens in: a miss forwards the leading client's fields, so a token in
    one of them would otherwise fetch a response the cache then shares.
    """
    # One pass over the request's fields, not one per credential field; the
    # first of CREDENTIAL_FIELDS it carries is named, as before.
    carried = {key.lower() for key in headers.keys()} & _CREDENTIALS_LOWER
    for name in CREDENTIAL_FIELDS:
        if name.lower() in carried:
            return f"request carries {name}"
    return None


def current_age(headers: Mapping[str, str], now: float | None = None) -> float:
    """Seconds the response had already lived when it arrived (RFC 9111 §4.2.3).

    Its `Age` (caches upstream), or with `now` (when it arrived) the larger
    of that and its apparent age, `now - Date` in whole seconds, so a
    response generated long ago is not taken as new. The node does not
    correct for its own request time. A list keeps its first member and an
    invalid value is ignored (§5.1).
    """
    value = field_value(headers, "Age")
    age = 0.0 if value is None else (delta_seconds(value.split(",", 1)[0]) or 0.0)
    if now is not None:
        date = http_date(field_value(headers, "Date"))
        if date is not None:
            age = max(age, float(int(max(0.0, now - date))))
    return age


@quick_init
@dataclass(frozen=True)
class Policy:
    storable: bool
    reason: str  # why not storable, or "ok"
    # Seconds the response stays fresh from `now`: its freshness lifetime
    # minus its Age. 0 or less: validate before any reuse; below 0 it was
    # stale that long already when it arrived (stale-if-error counts those).
    ttl: float = 0.0
    # Seconds past expiry a stored copy may still answer when the origin
    # fails or answers 5xx; 0 = never.
    stale_if_error: float = math.inf
    # Seconds past expiry a stored copy may answer while a background
    # revalidation runs (RFC 5861 §3).
    stale_while_revalidate: float = 0.0
    heuristic: bool = False  # ttl came from a heuristic, not from the origin


def response_directives(headers: Mapping[str, str],
                        targeted: tuple[str, ...] = ()) -> tuple[str, dict[str, str | None]]:
    """The field whose directives rule this cache's storing and freshness, and them.

    The first of the `targeted` fields (RFC 9213) present with a valid,
    non-empty value, else Cache-Control (cachenode/http/targeted.py).
    """
    found = targeted_directives(headers, targeted)
    if found is not None:
        return found
    return "Cache-Control", parse_cache_control(field_value(headers, "Cache-Control"))


def _explicit_lifetime(cc: dict[str, str | None], headers: Mapping[str, str], now: float, *,
                       use_expires: bool = True) -> float | None:
    """The origin's own freshness lifetime (RFC 9111 §4.2.1), or None when it gave none.

    A malformed s-maxage or max-age ("-1", "soon", no value) is explicit and
    stale: §4.2.1 encourages that over guessing. An invalid Expires ("0",
    "-1", garbage) is a date in the past (§5.3): explicit, and already expired.
    `use_expires` off: the directives came from a targeted field, under
    which Expires is ignored (RFC 9213 §2.1).
    """
    for directive in ("s-maxage", "max-age") if cc else ():  # most answers: no directive
        if directive in cc:
            lifetime = delta_seconds(cc[directive])
            return 0.0 if lifetime is None else lifetime
    if not use_expires:
        return None
    expires_value = field_value(headers, "Expires")
    if expires_value is None:
        return None
    expires = http_date(expires_value)
    if expires is None:
        return 0.0
    return max(0.0, expires - _date(headers, now))


def _date(headers: Mapping[str, str], now: float) -> float:
    """When the origin generated the response: its Date, else `now` (RFC 9110 §6.6.1)."""
    date = http_date(field_value(headers, "Date"))
    return now if date is None else date


def response_policy(status: int, headers: Mapping[str, str], *, now: float, policy_ttl: float | None,
                    private_ok: bool = False, targeted: tuple[str, ...] = (), age: float | None = None) -> Policy:
    """Storable? For how long? How stale may it be served? From the origin's status and headers.

    `policy_ttl` is the operator's per-origin lifetime for responses that
    carry no explicit one; it replaces the Last-Modified heuristic and is
    counted from storing, so the response's Age is not taken off it. With
    no such policy a response with a valid Last-Modified gets HEURISTIC_TTL,
    and one without gets nothing.

    `private_ok`: the origin authorises every read of what is stored
    (`credentials: authorize`), so a `private` response may be stored: no
    one but a caller the origin accepts is ever served it.

    `targeted`: the fields that address this cache (RFC 9213, the origin's
    `targeted_cache_control`), in order of precedence. The first present
    with a valid value replaces Cache-Control and Expires here.

    `age`: `current_age(headers, now)` when the caller has it already (a
    fill's leader stores it with the object): not worked out twice.
    """
    if status not in STORED_STATUSES:
        return Policy(False, f"status {status}")
    field, cc = response_directives(headers, targeted)
    refused = _refusal(headers, field, cc, private_ok=private_ok)
    if refused is not None:
        return refused
    if "no-cache" in cc:
        # §5.2.2.4: storable, but never reused, not even on error, without a
        # successful validation. A qualified no-cache="field" is treated
        # the same: stricter than required, never wrong.
        return Policy(True, "ok", 0.0, stale_if_error=0.0, stale_while_revalidate=0.0)
    stale_if_error, stale_while_revalidate = _stale_windows(cc)
    # The lifetime, as one Policy made at the end rather than a closure
    # made on every call: this runs for every cold fill.
    lifetime = _explicit_lifetime(cc, headers, now, use_expires=field == "Cache-Control")
    heuristic = lifetime is None and status in HEURISTIC_STATUSES
    if lifetime is not None:
        ttl = lifetime - (current_age(headers, now) if age is None else age)
    elif not heuristic:
        ttl = 0.0
    # §4.2.2. `public` would only widen this to responses to authenticated
    # requests, which this cache never stores.
    elif policy_ttl is not None:
        ttl = max(0.0, policy_ttl)
    elif http_date(field_value(headers, "Last-Modified")) is None:
        ttl = 0.0
    else:
        # A Last-Modified after Date is the origin's clock skew (aiohttp rounds
        # it up), not a reason to distrust the file.
        ttl = HEURISTIC_TTL - (current_age(headers, now) if age is None else age)
    return Policy(True, "ok", ttl, stale_if_error, stale_while_revalidate, heuristic)


def _refusal(headers: Mapping[str, str], field: str, cc: Mapping[str, str | None], *,
             private_ok: bool) -> Policy | None:
    """Why a response of a stored status must not be stored (its directives
    `cc`, read from `field`), or None when nothing forbids it."""
    # §5.2.2.3: must-understand lets a cache that understands the status
    # (every status stored here) store it despite no-store, which it is
    # paired with for the caches that do not.
    if "no-store" in cc and "must-understand" not in cc:
        return Policy(False, f"{field}: no-store")
    if "private" in cc and not private_ok:
        # Qualified or not: storing the rest while dropping the named fields
        # is allowed (§5.2.2.7) but not worth the risk of getting it wrong.
        return Policy(False, f"{field}: private")
    vary = field_value(headers, "Vary")
    if vary is not None and _lists_star(vary):
        return Policy(False, "Vary: *")  # RFC 9111 §4.1: never matches a later request
    if field_value(headers, "Set-Cookie") is not None:
        return Policy(False, "response sets a cookie")
    return None


# Remembered: an origin that varies sends the same Vary on every answer, and
# `split_list` reads it a character at a time.
@functools.lru_cache(maxsize=256)
def _lists_star(vary: str) -> bool:
    """Whether a Vary value lists "*"."""
    return "*" in split_list(vary)


def _stale_windows(cc: Mapping[str, str | None]) -> tuple[float, float]:
    """(stale_if_error, stale_while_revalidate) in seconds: how long past its
    lifetime a stored response may be served while its origin fails, and
    while it is revalidated."""
    if not cc:
        return math.inf, 0.0  # no directive: most answers
    if "must-revalidate" in cc or "proxy-revalidate" in cc or "s-maxage" in cc:
        # §5.2.2.2, §5.2.2.8; s-maxage implies proxy-revalidate (§5.2.2.10).
        return 0.0, 0.0
    # RFC 5861 §4. Without the directive this cache still answers from a
    # stale copy while its origin is down: §4.2.4 allows it when no
    # directive forbids it, and a dataset a training job can read beats a 502.
    sie = delta_seconds(cc.get("stale-if-error"))
    return (math.inf if sie is None else sie), (delta_seconds(cc.get("stale-while-revalidate")) or 0.0)


@dataclass(frozen=True)
class RequestDirectives:
    # Cache-Control: no-cache, or Pragma: no-cache when the request has no
    # Cache-Control field at all (RFC 9111 §5.4).
    no_cache: bool = False
    max_age: float | None = None  # a valid max-age=N
    max_stale: float | None = None  # max-stale=N; without a value math.inf; invalid None
    min_fresh: float | None = None
    only_if_cached: bool = False
    no_store: bool = False


def request_directives(headers: Mapping[str, str]) -> RequestDirectives:
    """What the client asks of the cache (RFC 9111 §5.2.1). A malformed argument counts as absent."""
    cc_value = field_value(headers, "Cache-Control")
    cc = parse_cache_control(cc_value)
    pragma_no_cache = cc_value is None and "no-cache" in parse_cache_control(field_value(headers, "Pragma"))
    if "max-stale" in cc:
        # §5.2.1.2: without a value the client accepts any staleness.
        max_stale = math.inf if cc["max-stale"] is None else delta_seconds(cc["max-stale"])
    else:
        max_stale = None
    return RequestDirectives(
        no_cache="no-cache" in cc or pragma_no_cache,
        max_age=delta_seconds(cc.get("max-age")),
        max_stale=max_stale,
        min_fresh=delta_seconds(cc.get("min-fresh")),
        only_if_cached="only-if-cached" in cc,
        no_store="no-store" in cc,
    )


class Use(enum.Enum):
    FRESH = "fresh"  # serve it, no origin contact
    STALE_WHILE_REVALIDATE = "swr"  # serve it now, revalidate in the background
    VALIDATE = "validate"  # ask the origin (conditional request) first


def age_of(*, now: float, stored_at: float, initial_age: float) -> float:
    """The Age to send with a stored copy: what it had when stored plus its time here (RFC 9111 §4.2.3, §5.1)."""
    return initial_age + max(0.0, now - stored_at)


def judge(*, now: float, stored_at: float, expires_at: float, initial_age: float,
          stale_if_error: float, stale_while_revalidate: float, request: RequestDirectives) -> Use:
    """May a stored copy answer this request, and how? (RFC 9111 §4.2, §5.2.1; RFC 5861 §3.)

    The request's own limits come first: they can only make the cache
    stricter. `stale_if_error == 0` is how a Policy marks must-revalidate,
    proxy-revalidate, s-maxage and no-cache, under which a stale copy is
    never served unvalidated, whatever max-stale the client sends (§5.2.2.2).
    """
    if request.no_cache:
        return Use.VALIDATE
    if request.max_age is not None:
        # max-age=0 is the common "revalidate" idiom: validate even at age 0.
        age = age_of(now=now, stored_at=stored_at, initial_age=initial_age)
        if request.max_age == 0 or age > request.max_age:
            return Use.VALIDATE
    if request.min_fresh is not None and expires_at - now < request.min_fresh:
        return Use.VALIDATE
    if now < expires_at:
        return Use.FRESH
    if stale_if_error == 0:
        return Use.VALIDATE
    staleness = now - expires_at
    if request.max_stale is not None and staleness <= request.max_stale:
        return Use.FRESH
    if staleness < stale_while_revalidate:
        return Use.STALE_WHILE_REVALIDATE
    return Use.VALIDATE


def may_serve_stale_on_error(*, now: float, expires_at: float, stale_if_error: float) -> bool:
    """Whether a stored copy may answer when the origin fails or answers 5xx (RFC 5861 §4, RFC 9111 §4.2.4)."""
    return stale_if_error > 0 and now - expires_at <= stale_if_error
