"""What a request names: its target, the origin configured for its host and
its cache key. One place, so the handler, the fast path and a follower
worker can never disagree about a request.
"""

from __future__ import annotations

from dataclasses import dataclass

from nezha.origins import Origin, OriginTable
from nezha.keys import Target, key_for, parse_target


def names_origin(table: OriginTable, host_header: str | None) -> bool:
    """Does the Host field name a configured origin (else the request is for the node itself, or refused)?"""
    if not host_header:
        return False
    return host_header.rsplit(":", 1)[0].lower().rstrip(".") in table


def resolve(table: OriginTable, raw_target: str, host_header: str | None,
            scheme: str = "http") -> tuple[Target, Origin | None, str | None]:
    """The request's target, the origin configured for its host (None:
    refused) and its cache key. Raises BadTarget."""
    target = parse_target(raw_target, host_header, scheme=scheme)
    origin = table.get(target.host)  # an absolute URI's host wins over Host:
    if origin is None:
        return target, None, None
    return target, origin, key_for(target, origin)


@dataclass(frozen=True)
class Asked:
    """What a client's request for an origin names, resolved."""

    target: Target
    origin: Origin
    key: str
    url: str  # where the origin is asked (the origin's upstream for the target's scheme and host)
