"""What may be stored and for how long (RFC 9111). Pure: no I/O.

A shared cache stores a response only when nothing in it or its request
says the response belongs to one client. Anything doubtful is passed through.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Mapping


def parse_cache_control(value: str | None) -> dict[str, str | None]:
    """`max-age=60, no-cache="set-cookie", private` -> {directive: argument}."""
    out: dict[str, str | None] = {}
    if not value:
        return out
    for part in value.split(","):
        name, sep, arg = part.strip().partition("=")
        name = name.strip().lower()
        if name:
            out[name] = arg.strip().strip('"') if sep else None
    return out


def _seconds(arg: str | None) -> float | None:
    try:
        return max(0.0, float(int(arg))) if arg is not None else None
    except ValueError:
        return None


def http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


@dataclass(frozen=True)
class Policy:
    storable: bool
    reason: str  # why not storable, or "ok"
    ttl: float = 0.0
    stale_if_error: bool = True


def request_bypasses_cache(headers: Mapping[str, str]) -> str | None:
    """Why a request must go straight to the origin, or None.

    Credentials make a response one client's own; neither serving it from
    the cache nor storing it is ever right (RFC 9111 §3.5).
    """
    for name in ("Authorization", "Cookie"):
        if name in headers:
            return f"request carries {name}"
    return None


def current_age(headers: Mapping[str, str]) -> float:
    """Seconds the response already spent in caches upstream: its `Age`.

    RFC 9111 §4.2.3, simplified to max(0, Age): the node does not correct
    for its own request time. A list keeps its first member and an invalid
    value is ignored (§5.1).
    """
    value = headers.get("Age")
    if value is None:
        return 0.0
    first = value.split(",", 1)[0].strip()
    return float(first) if first.isascii() and first.isdigit() else 0.0


def response_policy(status: int, headers: Mapping[str, str], *, default_ttl: float, now: float) -> Policy:
    """Storable? For how long? From the origin's status and headers.

    An explicit lifetime (s-maxage, max-age, Expires) is what is left of it
    after the response's `Age`; `default_ttl` is this node's own policy for
    objects without one, counted from when it stores them.
    """
    if status != 200:
        return Policy(False, f"status {status}")
    cc = parse_cache_control(headers.get("Cache-Control"))
    if "no-store" in cc:
        return Policy(False, "Cache-Control: no-store")
    if "private" in cc:
        return Policy(False, "Cache-Control: private")
    if headers.get("Vary", "").strip() == "*":
        return Policy(False, "Vary: *")
    if "Set-Cookie" in headers:
        return Policy(False, "response sets a cookie")
    stale_ok = "must-revalidate" not in cc and "proxy-revalidate" not in cc
    if "no-cache" in cc:
        return Policy(True, "ok", 0.0, stale_ok)
    for directive in ("s-maxage", "max-age"):
        if directive in cc:
            lifetime = _seconds(cc[directive])
            if lifetime is not None:
                return Policy(True, "ok", max(0.0, lifetime - current_age(headers)), stale_ok)
    expires = http_date(headers.get("Expires"))
    if "Expires" in headers:
        date = http_date(headers.get("Date")) or now
        lifetime = (expires or 0.0) - date
        return Policy(True, "ok", max(0.0, lifetime - current_age(headers)), stale_ok)
    return Policy(True, "ok", default_ttl, stale_ok)
