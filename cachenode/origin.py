"""The node's HTTP client for origins (and, later, peers).

Maps transport failures to named errors the handlers answer with: refused
or reset connections are `OriginError` (502), silence is `OriginTimeout`
(504). Only URLs built from the configured origin table reach this module.
"""

from __future__ import annotations

import asyncio
from typing import Mapping

import aiohttp

from nezha.errors import OriginError, OriginTimeout

# Hop-by-hop headers (RFC 9110 §7.6.1) never cross the cache.
HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
    "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
))


def end_to_end(headers: Mapping[str, str]) -> dict[str, str]:
    listed = {h.strip().lower() for h in headers.get("Connection", "").split(",") if h.strip()}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in listed}


class OriginClient:
    def __init__(self, *, connect_timeout: float, read_timeout: float, limit: int = 256) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._session: aiohttp.ClientSession | None = None
        self._limit = limit

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._limit, ttl_dns_cache=60),
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            read_bufsize=1 << 20,  # fewer, larger reads from origins and peers
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, url: str, *, headers: Mapping[str, str], what: str,
                      timeout: aiohttp.ClientTimeout | None = None, json: object = None) -> aiohttp.ClientResponse:
        """Send a request and return once the response headers are in.

        `what` names the thing being fetched in error messages ("origin
        http://host/path"). The caller must release the response.
        """
        assert self._session is not None, "OriginClient.start() was not awaited"
        try:
            return await self._session.request(
                method, url, headers=headers, allow_redirects=False, timeout=timeout or self._timeout, json=json)
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise OriginTimeout(f"{what}: no answer within the timeout "
                                f"(connect {self._connect_timeout:g}s, read {self._read_timeout:g}s)") from e
        except aiohttp.ClientConnectorError as e:
            raise OriginError(f"{what}: cannot connect: {e.os_error or e}") from e
        except aiohttp.ClientError as e:
            raise OriginError(f"{what}: {type(e).__name__}: {e}") from e
        except OSError as e:
            raise OriginError(f"{what}: {e}") from e
