"""The origins: each dataset host the cache may contact, its rules, and the table that finds one by name.

An origin's entry (`Origin`) is the per-host part of the settings: a cache
node, the controller (to key a prefetched URL as the node does) and `nezha
up` read it from `--origin HOST=URL`, `NEZHA_ORIGINS` or `origins` in
`--config`. `OriginTable` answers "which origin serves this name", exact
host first, then a `*.domain` pattern.
"""

from __future__ import annotations

import json
import re
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from yarl import URL

from nezha.values import chunk_setting, parse_size

if TYPE_CHECKING:
    from nezha.keys import Target

_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
# RFC 9110 §5.1: a field name is a token.
_FIELD_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

HOST_PLACEHOLDER = "{host}"


class Origin(BaseModel):
    """One dataset host the cache may contact, and where it really lives.

    `host` is the name clients ask for (`www.cs.toronto.edu`); `upstream` is
    where the node fetches it (`http://www.cs.toronto.edu` in a cluster, a
    local server in tests), each request's path and query appended, so a
    path in it is a prefix. Keyed by `host`, so an HTTPS listener with
    per-host certificates can be added without changing the table.
    """

    # An origin's settings decide what is cached for whom: a misspelt key is
    # refused (load() names it, with a "did you mean"), never ignored.
    model_config = ConfigDict(extra="forbid")

    host: str
    upstream: str
    # The operator's lifetime for this origin's responses that carry none of
    # their own (RFC 9111 §4.2.2 heuristic freshness), whether or not they
    # have Last-Modified. Unset: those with Last-Modified get an hour
    # (cachenode/http/freshness.py HEURISTIC_TTL), those without are revalidated.
    default_ttl: float | None = None
    volatile_params: tuple[str, ...] = ()
    # Who may read a stored object (docs/private-objects.md). `pass`: a
    # request with credentials (Authorization, a signed URL) is passed
    # through and nothing of it is stored. `authorize`: it is keyed without
    # them, stored once, and every read from disk is first authorised by the
    # origin with the caller's own request.
    credentials: Literal["pass", "authorize"] = "pass"
    # This origin's own credential query parameters (an API's `token=` or
    # `key=`), beside the signed-URL families every origin knows
    # (nezha/credentials.py): kept out of keys, metadata, the index and logs.
    credential_params: tuple[str, ...] = ()
    # The response fields that address this cache's caching alone (RFC 9213
    # targeted cache control), first present wins over Cache-Control and
    # Expires for what the node stores and for how long; forwarded untouched
    # (cachenode/http/targeted.py). [] leaves Cache-Control in charge.
    targeted_cache_control: tuple[str, ...] = ("Nezha-Cache-Control", "CDN-Cache-Control")
    # Parallel range fills of this origin's large objects (cachenode/fill/parallel.py);
    # unset: the node's fill_streams, parallel_fill_threshold and fill_on_range.
    fill_streams: int | None = None
    parallel_fill_threshold: int | None = None
    fill_on_range: bool | None = None
    # Chunks across the ring (nezha/chunks.py) for this origin's objects at
    # least `chunk_threshold` long (0: never), `chunk_size` each; unset: the
    # node's chunk_threshold and chunk_size.
    chunk_threshold: int | None = None
    chunk_size: int | None = None
    # TLS clients of this host (port 443, cachenode/tls/port.py). With a CA
    # on the node the handshake is made there and their requests are cached
    # under https:// keys; `passthrough` relays their connections untouched
    # to the real host instead (as every origin is relayed on a node without
    # a CA). `tls_upstream` is where their requests are fetched: default the
    # upstream when it is https://, else https://HOST; `ca_bundle` the PEM
    # roots that origin's certificate must verify against (default: the
    # system store).
    tls: Literal["terminate", "passthrough"] = "terminate"
    tls_upstream: str | None = None
    ca_bundle: Path | None = None

    @field_validator("credential_params")
    @classmethod
    def _credential_params(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not name or any(c in name for c in "=&?# "):
                raise ValueError(f"credential_params entry {name!r} is not a query parameter name")
        return v

    @field_validator("targeted_cache_control")
    @classmethod
    def _targeted_cache_control(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not _FIELD_NAME_RE.match(name):
                raise ValueError(f"targeted_cache_control entry {name!r} is not a header field name")
        lowered = [name.lower() for name in v]
        for name in v:
            if lowered.count(name.lower()) > 1:
                raise ValueError(f"targeted_cache_control names {name!r} twice")
            if name.lower() == "cache-control":
                raise ValueError("targeted_cache_control lists Cache-Control, which rules anyway when no "
                                 "targeted field is present: list only fields that address this cache")
        return v

    @field_validator("parallel_fill_threshold", mode="before")
    @classmethod
    def _threshold(cls, v: Any) -> Any:
        return None if v is None else parse_size(v)

    @field_validator("chunk_threshold", "chunk_size", mode="before")
    @classmethod
    def _chunk_sizes(cls, v: Any, info: Any) -> Any:
        return None if v is None else chunk_setting(v, field=info.field_name)

    @field_validator("fill_streams")
    @classmethod
    def _streams(cls, v: int | None) -> int | None:
        return None if v is None else check_fill_streams(v)

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        v = v.strip().lower().rstrip(".")
        name = v[2:] if v.startswith("*.") else v
        if not _HOST_RE.match(name) or (v.startswith("*.") and "." not in name):
            raise ValueError(f"origin host {v!r} is not a hostname or a *.domain pattern (of at least two labels)")
        return v

    @property
    def wildcard(self) -> bool:
        """`*.domain`: every name one label under `domain` (as a TLS wildcard covers), e.g. S3's bucket hosts."""
        return self.host.startswith("*.")

    @field_validator("upstream", "tls_upstream")
    @classmethod
    def _upstream(cls, v: str | None, info: Any) -> str | None:
        if v is None:
            return v
        u = URL(v.replace(HOST_PLACEHOLDER, "placeholder.invalid"))
        if u.scheme not in ("http", "https") or not u.host:
            raise ValueError(f"origin {info.field_name} {v!r} must be an http:// or https:// URL")
        return v.rstrip("/") if HOST_PLACEHOLDER in v else str(u).rstrip("/")

    @model_validator(mode="after")
    def _placeholder(self) -> "Origin":
        if not self.wildcard and any(HOST_PLACEHOLDER in (u or "") for u in (self.upstream, self.tls_upstream)):
            raise ValueError(f"origin {self.host!r}: {HOST_PLACEHOLDER} in an upstream is for *.domain origins only")
        return self

    @field_validator("ca_bundle")
    @classmethod
    def _ca_bundle(cls, v: Path | None) -> Path | None:
        if v is not None:
            try:
                ssl.create_default_context(cafile=str(v))
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"ca_bundle {str(v)!r} is not a readable PEM bundle: {e}") from e
        return v

    def upstream_for(self, scheme: str, host: str) -> str:
        """Where a request for `host` that came in as `scheme` (http or https) is fetched;
        `{host}` in a *.domain origin's upstream is the name asked for."""
        if scheme != "https":
            chosen = self.upstream
        elif self.tls_upstream is not None:
            chosen = self.tls_upstream
        elif self.upstream.startswith("https://"):
            chosen = self.upstream
        else:
            chosen = f"https://{HOST_PLACEHOLDER}"
        return chosen.replace(HOST_PLACEHOLDER, host)

    def url_of(self, target: Target) -> str:
        """Where `target`, one of this origin's, is fetched: its upstream (`upstream_for`) and its path and query."""
        return self.upstream_for(target.scheme, target.host) + target.path_qs

    @classmethod
    def parse(cls, spec: str) -> "Origin":
        """`HOST=UPSTREAM_URL`, as given to `--origin`."""
        return cls(**origin_fields(spec))


def check_fill_streams(v: int) -> int:
    """fill_streams of a node or of one origin: ranges fetched at once for one object."""
    if not 1 <= v <= 64:
        raise ValueError(f"fill_streams ({v}) must be between 1 and 64")
    return v


def origin_fields(spec: str) -> dict[str, str]:
    """`HOST=UPSTREAM_URL` (an --origin flag, an entry of NEZHA_ORIGINS) as an origin's fields, left
    for the model to check: an error then names the entry's field and index."""
    host, sep, upstream = spec.partition("=")
    if not sep:
        raise ValueError(f"--origin wants HOST=UPSTREAM_URL, got {spec!r}")
    return {"host": host, "upstream": upstream}


def origin_specs(text: str) -> list[str] | None:
    """The HOST=URL entries of `host=url,host2=url2` (NEZHA_ORIGINS' handy form); None for JSON."""
    text = text.strip()
    if text.startswith(("[", "{")):
        return None
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_origins(value: Any) -> Any:
    """Origin entries as a list of HOST=URL strings or objects, a JSON text of either,
    or (the handy form for NEZHA_ORIGINS) `host=url,host2=url2`."""
    if isinstance(value, str):
        specs = origin_specs(value)
        if specs is None:
            try:
                value = json.loads(value)
            except ValueError as e:
                raise ValueError(f"origins: not valid JSON: {e}") from e
        else:
            value = specs
    if isinstance(value, dict):
        value = [{"host": h, "upstream": u} for h, u in value.items()]
    return [origin_fields(v) if isinstance(v, str) else v for v in (value or [])]


class OriginTable:
    """The origin table: the origin entries by the name a client asks for: an exact host first, else the
    `*.domain` pattern one label above it (`b1.s3.amazonaws.com` is under
    `*.s3.amazonaws.com`; `a.b1.s3.amazonaws.com` is not, as a TLS wildcard
    certificate would not cover it either)."""

    def __init__(self, entries: list[Origin]) -> None:
        self._exact = {o.host: o for o in entries if not o.wildcard}
        self._under = {o.host[2:]: o for o in entries if o.wildcard}

    def get(self, host: str) -> Origin | None:
        found = self._exact.get(host)
        if found is None and self._under and "." in host:
            found = self._under.get(host.split(".", 1)[1])
        return found

    def __contains__(self, host: object) -> bool:
        return isinstance(host, str) and self.get(host) is not None

    def __getitem__(self, host: str) -> Origin:
        found = self.get(host)
        if found is None:
            raise KeyError(host)
        return found

    def certificate_name(self, host: str) -> str | None:
        """The name a leaf for `host` is made for: the host itself, or its origin's `*.domain`."""
        found = self.get(host)
        if found is None:
            return None
        return found.host if found.wildcard else host
