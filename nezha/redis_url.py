"""The index's Redis URLs (pure): which forms every command takes, how a password is hidden.

One contract for the nodes, the controller and the CLI (`--redis-url`,
`NEZHA_REDIS_URL`, the chart's `redis.external.url`):

    redis://[[USER]:PASSWORD@]HOST:PORT[/DB]        one Redis
    rediss://...                                     the same over TLS
    unix:///path/redis.sock[?db=N]                   a local socket
    redis+sentinel://[[USER]:PASSWORD@]H1:P1[,H2:P2...]/SERVICE[/DB]
                                                     the master Sentinel names SERVICE, asked of
                                                     any of the Sentinels, followed on failover

The password in a Sentinel URL is the master's; the Sentinels themselves
are asked without one (Sentinel's default; a `sentinel_password` query
parameter gives one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")

_SENTINEL = re.compile(r"^redis\+sentinel://(?:(?P<user>[^:@/]*)(?::(?P<password>[^@/]*))?@)?"
                       r"(?P<hosts>[^/?@]+)/(?P<service>[^/?]+)(?:/(?P<db>\d+))?/?(?:\?(?P<query>.*))?$")
_USERINFO = re.compile(r"^(?P<scheme>[a-z+]+://)(?P<user>[^:@/]*):(?P<password>[^@/]*)@")


class BadRedisURL(ValueError):
    pass


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def check(url: str) -> str:
    """`url` if it is one of the forms above, else BadRedisURL naming the forms (and never the password)."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES or re.search(r"\s", url):
        raise BadRedisURL(f"redis_url must be redis://, rediss://, unix:// or redis+sentinel://, "
                          f"got {redact(url)!r}")
    if scheme == "redis+sentinel":
        parse_sentinel(url)
    return url


def parse_sentinel(url: str) -> SentinelURL:
    m = _SENTINEL.match(url)
    if not m:
        raise BadRedisURL(f"a Sentinel URL is redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB], "
                          f"got {redact(url)!r}")
    hosts = []
    for part in m.group("hosts").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise BadRedisURL(f"Sentinel address {part!r} must be HOST:PORT (in {redact(url)!r})")
        hosts.append((host.strip("[]"), int(port)))
    query = parse_qs(m.group("query") or "")
    return SentinelURL(sentinels=tuple(hosts), service=unquote(m.group("service")), db=int(m.group("db") or 0),
                       username=unquote(m.group("user")) or None if m.group("user") else None,
                       password=unquote(m.group("password")) if m.group("password") is not None else None,
                       sentinel_password=(query.get("sentinel_password") or [None])[0])


def redact(url: str) -> str:
    """`url` with any password replaced by `***`, for logs and messages."""
    url = _USERINFO.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:***@", url)
    return re.sub(r"(sentinel_password=)[^&]*", r"\1***", url)
