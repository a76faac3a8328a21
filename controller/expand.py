"""Prefetch names expanded into object URLs: the I/O edge around nezha/prefetch/.

The listings (the Hub's revision and tree APIs, S3's ListObjectsV2, a
manifest, an index page) are metadata the cache does not store, so the
controller reads them itself, from where the origin table says each host
lives (`Origin.upstream_for`): only configured origins are ever contacted,
by the controller as by the nodes. A name is addressed by its public URL
(`https://huggingface.co/...`, `https://s3.amazonaws.com/BUCKET/...`) and
that URL's host must be an origin; a host that is not one is refused
(`NotAnOrigin`) before anything is asked of it.

Which host the Hub and S3 are is the controller's settings (`hub_host`,
`s3_host`, defaults `huggingface.co` and `s3.amazonaws.com`): S3 is
addressed path-style through that one origin, as boto3 addresses it with
`AWS_ENDPOINT_URL_S3` (docs/https.md), so the keys the nodes store are the
keys a client's reads ask for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import aiohttp

from nezha.errors import NezhaError
from nezha.origins import OriginTable
from nezha.prefetch import listings
from nezha.prefetch.names import HubRepo, Listing, Name, ObjectUrl, S3Prefix


class ExpandFailed(NezhaError):
    """A name whose listing could not be read, or read as one; the message names the URL and the cause."""


class NotAnOrigin(ExpandFailed):
    """A name that expands to (or is listed on) a host outside the origin table: nothing of it is fetched."""

    def __init__(self, hosts: list[str]) -> None:
        super().__init__(f"expands to {', '.join(hosts)}, not in the origin table")
        self.hosts = hosts


@dataclass
class Expansion:
    """The object URLs a name stands for, and what the status says of it (`expanded_from`)."""

    urls: list[str]
    note: dict = field(default_factory=dict)


Auth = Callable[[str, str], dict[str, str]]  # (public URL, upstream URL) -> fields (controller/sources.py)


class Expander:
    def __init__(self, *, session: Callable[[], aiohttp.ClientSession], origins: OriginTable,
                 hub_host: str = "huggingface.co", s3_host: str = "s3.amazonaws.com",
                 max_objects: int = 1_000_000, s3_page_keys: int | None = None, timeout: float = 60.0) -> None:
        """`max_objects`: a name listing more is refused whole, naming the count (an annotation typo such as
        a bucket's root instead of a prefix would otherwise start millions of fills)."""
        self._session = session
        self._origins = origins
        self.hub_host = hub_host
        self.s3_host = s3_host
        self.max_objects = max_objects
        self.s3_page_keys = s3_page_keys
        self.timeout = timeout

    async def expand(self, name: Name, *, auth: Auth | None = None) -> Expansion:
        """The URLs `name` stands for. `auth(public_url, upstream_url)` gives the fields that authenticate
        one listing request (a Hub token, S3's SigV4: controller/sources.py)."""
        if isinstance(name, ObjectUrl):
            return Expansion([name.url])
        if isinstance(name, HubRepo):
            expansion = await self._hub(name, auth)
        elif isinstance(name, S3Prefix):
            expansion = await self._s3(name, auth)
        else:
            expansion = await self._listing(name, auth)
        outside = listings.hosts_outside(expansion.urls, lambda host: host in self._origins)
        if outside:
            raise NotAnOrigin(outside)
        return expansion

    async def _hub(self, name: HubRepo, auth: Auth | None) -> Expansion:
        base = f"https://{self.hub_host}"
        body, _ = await self._get(base + listings.hub_revision_path(name), auth)
        commit = listings.hub_commit(body)
        files: list[str] = []
        page: str | None = base + listings.hub_tree_path(name, commit)
        while page is not None:
            body, answer = await self._get(page, auth)
            files += listings.hub_files(body)
            self._check_count(len(files), page)
            link = listings.next_link(answer.get("Link"))
            page = urljoin(page, link) if link else None
        urls = [listings.hub_resolve_url(self.hub_host, name, commit, path) for path in files]
        return Expansion(urls, {"revision": name.revision, "commit": commit})

    async def _s3(self, name: S3Prefix, auth: Auth | None) -> Expansion:
        keys: list[str] = []
        token: str | None = None
        while True:
            url = f"https://{self.s3_host}/{name.bucket}?{listings.s3_list_query(name.prefix, token, self.s3_page_keys)}"
            body, _ = await self._get(url, auth)
            page, token = listings.s3_listing(body)
            keys += page
            self._check_count(len(keys), url)
            if token is None:
                break
        return Expansion([listings.s3_object_url(self.s3_host, name.bucket, k) for k in keys])

    async def _listing(self, name: Listing, auth: Auth | None) -> Expansion:
        body, _ = await self._get(name.url, auth)
        urls = listings.manifest_urls(body, name.url) if name.manifest else listings.index_urls(body, name.url)
        self._check_count(len(urls), name.url)
        return Expansion(urls)

    def _check_count(self, count: int, url: str) -> None:
        if count > self.max_objects:
            raise ExpandFailed(f"{url} lists more than {self.max_objects} objects (prefetch_max_objects)")

    async def _get(self, url: str, auth: Auth | None) -> tuple[str, Mapping[str, str]]:
        """GET `url` (by its public name) from where its origin lives; the body and the answer's fields."""
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        origin = self._origins.get(host)
        if origin is None:
            raise NotAnOrigin([host or url])
        upstream = origin.upstream_for(parts.scheme, host) + (parts.path or "/") + (
            f"?{parts.query}" if parts.query else "")
        sent = auth(url, upstream) if auth is not None else {}
        try:
            async with self._session().get(upstream, headers=sent, allow_redirects=False,
                                           timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                text = await r.text(errors="replace")
                if r.status != 200:
                    detail = (r.headers.get("X-Error-Message") or text[:200]).strip().replace("\n", " ")
                    raise ExpandFailed(f"{url} answered {r.status}" + (f": {detail}" if detail else ""))
                return text, r.headers
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ExpandFailed(f"{url} could not be read: {type(e).__name__}: {e}") from e
