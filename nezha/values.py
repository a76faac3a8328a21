"""Values as users type them: sizes (`10GiB`), `HOST:PORT`, Redis URLs.

Pure parsers shared by the settings (nezha/config/) and the origin table
(nezha/origins.py); each raises ValueError with a message naming the value,
which the loader turns into a line naming the flag, variable or file key.
"""

from __future__ import annotations

import re
from typing import Any

from nezha import redis_url

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(value: Any) -> int:
    """Bytes from an int or a string such as `10GiB`, `500M`, `1048576`."""
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"not a size: {value!r} (use bytes or a suffix such as 500M, 10GiB)")
    unit = (m.group(2) or "").lower().rstrip("b")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_hostport(value: str, *, field: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{field} must be HOST:PORT, got {value!r}")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"{field} port {int(port)} is out of range: a TCP port is 0-65535 (0: any free one)")
    return host.strip("[]"), int(port)


def check_redis_url(value: str | None) -> str | None:
    """A Redis URL as every command takes it (`--redis-url`): the forms of nezha/redis_url.py."""
    if value is not None:
        try:
            redis_url.check(value)
        except redis_url.BadRedisURL as e:
            raise ValueError(f"{e} (--redis-url)") from e
    return value


def chunk_setting(value: Any, *, field: str) -> int:
    """chunk_threshold (0: chunking off) or chunk_size (at least 1 MiB: a
    chunk is a stored object and a peer request of its own)."""
    size = parse_size(value)
    if field == "chunk_size" and size < 2**20:
        raise ValueError(f"chunk_size ({size} bytes) must be at least 1MiB: each chunk is an object and a request")
    if size < 0:
        raise ValueError(f"{field} ({size}) must not be negative")
    return size
