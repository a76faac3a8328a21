"""Request targets and cache keys. Pure: no I/O.

The cache key is the object's identity everywhere (disk, peers, Redis):
`scheme://host/path?query`, with the path kept as the client encoded it and
the per-origin volatile query parameters removed. On disk an object is named
by the SHA-256 of its key, never by anything the client typed, so no request
can choose a file name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

from nezha.credentials import credential_names
from nezha.errors import NezhaError
from nezha.frozen import quick_init
from nezha.memo import keep


class BadTarget(NezhaError):
    """The request line or Host header cannot name an object."""


class BadHost(BadTarget):
    """The host named is not a hostname any origin can have (an IP literal, an
    underscore): like any host that is not configured, it is refused (403)."""


_CTL = re.compile(r"[\x00-\x20\x7f]")
_HOST = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
# What nearly every dataset client sends: origin form, a path of unreserved
# characters and slashes only (RFC 3986 §2.3: nothing to unquote, no
# backslash), a query with no control character, space or fragment. Such a
# target is read as `_parse_any` reads it without going through its steps
# (tests/unit/nezha/test_plain_targets.py compares the two), once its path is known
# to hold no "/." (a dot segment follows a slash).
_PLAIN_TARGET = re.compile(r"(/[A-Za-z0-9._~/-]*)(?:\?([^\x00-\x20\x7f#]*))?")
# Host fields already read (`_split_host`), by their text: clients name a few
# hosts. Bounded (cleared when full) as the host is the client's to choose;
# a host refused is judged again each time.
_HOSTS: dict[str, str] = {}
_HOSTS_MAX = 1024


@quick_init  # one is made for every target not seen before (each of a cold epoch's requests)
@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    path: str  # percent-encoded, as sent, always starting with "/"
    query: str  # percent-encoded, without "?"

    @property
    def path_qs(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path


def _split_host(hostport: str) -> str:
    host = hostport.strip().lower()
    if host.startswith("["):
        raise BadHost(f"IP literal host {hostport!r} is not a dataset origin")
    host = host.rsplit(":", 1)[0] if ":" in host else host
    host = host.rstrip(".")
    if not host or not _HOST.match(host):
        raise BadHost(f"host {hostport!r} is not a valid hostname")
    return host


def _host_field(host_header: str) -> str:
    """`_split_host` of a Host field, remembered."""
    host = _HOSTS.get(host_header)
    if host is None:
        host = keep(_HOSTS, host_header, _split_host(host_header), _HOSTS_MAX)
    return host


def parse_target(raw_target: str, host_header: str | None, *, scheme: str = "http") -> Target:
    """Read the host and path a client asked for (`_parse_any`), a plain
    target (`_PLAIN_TARGET`) at the cost of one match."""
    plain = _PLAIN_TARGET.fullmatch(raw_target) if host_header else None
    if plain is None:
        return _parse_any(raw_target, host_header, scheme=scheme)
    path, query = plain.groups("")
    if "/." in path:
        return _parse_any(raw_target, host_header, scheme=scheme)
    return Target(scheme, _host_field(host_header), path, query)  # by position: cheaper


def _parse_any(raw_target: str, host_header: str | None, *, scheme: str = "http") -> Target:
    """Read the host and path a client asked for.

    Accepts origin form (`GET /path` with `Host:`) and the absolute-URI proxy
    form (`GET http://host/path`), where the URI's host wins over `Host:` as
    RFC 9112 §3.2.2 requires. Dot segments are refused rather than resolved:
    a client that sends them is probing, and the origin may resolve them
    differently than we would.
    """
    if _CTL.search(raw_target):
        raise BadTarget("request target contains control characters or spaces")
    if raw_target.startswith("/"):
        if not host_header:
            raise BadTarget("request has no Host header")
        host = _host_field(host_header)
        rest = raw_target
    else:
        m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)$", raw_target)
        if not m:
            raise BadTarget(f"request target {raw_target[:200]!r} is neither a path nor an absolute URI")
        scheme = m.group(1).lower()
        if scheme not in ("http", "https"):
            raise BadTarget(f"scheme {scheme!r} is not served")
        authority = m.group(2)
        if "@" in authority:
            raise BadTarget("credentials in the request URI are not accepted")
        host = _split_host(authority)
        rest = m.group(3) or "/"
        if not rest.startswith("/"):
            rest = "/" + rest
    rest = rest.split("#", 1)[0]
    path, _, query = rest.partition("?")
    segments = unquote(path).replace("\\", "/").split("/")
    if any(seg in (".", "..") for seg in segments):
        raise BadTarget(f"path {path[:200]!r} contains a dot segment")
    return Target(scheme=scheme, host=host, path=path, query=query)


def cache_key(target: Target, *, volatile_params: tuple[str, ...] = ()) -> str:
    """The object's identity: scheme, host, path and the stable query."""
    query = target.query
    if query and volatile_params:
        drop = set(volatile_params)
        query = "&".join(p for p in query.split("&") if p.split("=", 1)[0] not in drop)
    qs = f"?{query}" if query else ""
    return f"{target.scheme}://{target.host}{target.path}{qs}"


class KeyRules(Protocol):
    """What an origin's entry says about its keys (nezha.origins.Origin)."""

    volatile_params: tuple[str, ...]
    credentials: str  # "pass" or "authorize"
    credential_params: tuple[str, ...]  # the origin's own credential query parameters (nezha/credentials.py)


def key_for(target: Target, origin: KeyRules | None) -> str:
    """The key `target` is stored under, by its origin's rules (None: an origin
    not configured here, whose keys keep their whole query). The node, the
    controller's prefetch and the CLI all key through this one function, so
    none of them can ask a node for a key it never stores.

    An `authorize` origin's keys also leave out the URL's credential
    parameters (nezha/credentials.py), whatever their case: URLs signed again
    for the same object, by anyone, name one stored copy, and each read of it
    is authorised apart."""
    if origin is None:
        return cache_key(target)
    volatile = origin.volatile_params
    if origin.credentials == "authorize" and target.query:
        volatile = (*volatile, *credential_names(target.query, origin.credential_params))
    return cache_key(target, volatile_params=volatile)


def credentials_kept(target: Target, origin: KeyRules | None) -> list[str]:
    """The credential parameters of `target`'s URL (a presigned URL's
    signature, nezha/credentials.py) that its key would hold: those its
    origin does not declare volatile. A response to such a request is never
    stored: the key, the metadata and the index would carry a bearer
    credential."""
    if not target.query or (origin is not None and origin.credentials == "authorize"):
        return []  # an authorize origin's keys leave every credential out (key_for)
    volatile = set(origin.volatile_params) if origin is not None else set()
    extra = origin.credential_params if origin is not None else ()
    return [n for n in credential_names(target.query, extra) if n not in volatile]


def target_of(key: str) -> Target:
    """The target a key was made from, for work that starts from a stored key
    (a hand-off, a replica copy): scheme, host, path and the stable query."""
    scheme, _, rest = key.partition("://")
    host, _, path_qs = rest.partition("/")
    path, _, query = ("/" + path_qs).partition("?")
    return Target(scheme=scheme, host=host, path=path, query=query)


def host_of(key: str) -> str:
    """The origin host a key names."""
    return key.split("://", 1)[-1].split("/", 1)[0]


def object_id(key: str) -> str:
    """File-system-safe name of a key's object: hex SHA-256."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
