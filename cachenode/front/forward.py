"""Any method but GET and HEAD: to the origin as sent, body streamed, and a
success of an unsafe one invalidates what the cluster holds for the URL.

RFC 9111 §4.4: the URL, and Location and Content-Location on the same
host, are forgotten here and on the key's owners before the client hears
of the success, so a GET that follows a finished PUT never gets the old
bytes.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp import web

from cachenode.cluster.invalidation import Invalidation
from cachenode.front.middleware import SAFE_METHODS
from cachenode.front.names import Asked, resolve
from cachenode.front.respond import Responder
from nezha.keys import BadTarget, Target
from nezha.origins import OriginTable
from nezha.wire import CacheOutcome


class Forwarding:
    def __init__(self, *, table: OriginTable, respond: Responder, invalidation: Invalidation) -> None:
        self.table = table
        self.respond = respond
        self.invalidation = invalidation

    async def forward(self, request: web.Request, asked: Asked) -> web.StreamResponse:
        target = asked.target

        async def on_response(response: aiohttp.ClientResponse) -> None:
            if request.method in SAFE_METHODS or not 200 <= response.status < 400:
                return
            keys = [asked.key]
            for name in ("Location", "Content-Location"):
                other = self._same_host_key(response.headers.get(name), target)
                if other is not None and other not in keys:
                    keys.append(other)
            await self.invalidate(keys, why=f"{request.method} {target.path[:200]} answered {response.status}")

        return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS, on_response=on_response)

    def _same_host_key(self, reference: str | None, base: Target) -> str | None:
        """The cache key a Location or Content-Location names, when it is on the
        request's own host (§4.4 forbids invalidating another host's objects)."""
        if not reference:
            return None
        try:
            absolute = urlsplit(urljoin(f"{base.scheme}://{base.host}{base.path_qs}", reference.strip()))
            if absolute.scheme != base.scheme or (absolute.hostname or "").rstrip(".") != base.host:
                return None
            path_qs = (absolute.path or "/") + (f"?{absolute.query}" if absolute.query else "")
            _, _, key = resolve(self.table, path_qs, base.host, scheme=base.scheme)
        except (ValueError, BadTarget):
            return None
        return key

    async def invalidate(self, keys: list[str], *, why: str) -> None:
        """Forget `keys` here and on every other node that may hold them, owner
        or hot copy (their copies would answer a GET with what the write replaced)."""
        await self.invalidation.everywhere(keys, why=why)
