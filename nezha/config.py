"""Settings for every component, read in one place.

Precedence, highest first: command-line flags, `NEZHA_*` environment
variables, an optional YAML file (`--config FILE`, a flat mapping of field
names), then the defaults below. Nothing else in Nezha reads the environment.
Each component gets its own class and receives it as `settings=`.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import os
import re
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
import yaml
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError
from yarl import URL

from nezha import redis_url
from nezha.errors import ConfigError

# The --config file's settings while `load` builds a settings object (the lowest-priority source).
_file_settings: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("nezha_file_settings",
                                                                                      default=None)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Reserved for the test suite (NEZHA_TEST_KUBECONFIG ...) and for what `nezha cache --workers`
# tells each worker it starts (cachenode/workers/supervisor.py): never a setting, never refused.
_TEST_VARIABLES = ("NEZHA_TEST_", "NEZHA_WORKER_")
# dest -> the flag that sets it (`origins` -> `--origin`), filled by nezha.cli from its parsers, so
# an error can name the flag the user typed.
FLAG_NAMES: dict[str, str] = {}
# The command being run (`nezha cache`), for messages; set by nezha.cli.
COMMAND = "nezha"

_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
# RFC 9110 §5.1: a field name is a token.
_FIELD_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


# Owners per key in a cluster unless configured: one node can go away (a
# crash, a drain, a rolling restart) without an object being lost or fetched
# again from the origin.
DEFAULT_CLUSTER_REPLICAS = 2


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


def _chunk_setting(value: Any, *, field: str) -> int:
    """chunk_threshold (0: chunking off) or chunk_size (at least 1 MiB: a
    chunk is a stored object and a peer request of its own)."""
    size = parse_size(value)
    if field == "chunk_size" and size < 2**20:
        raise ValueError(f"chunk_size ({size} bytes) must be at least 1MiB: each chunk is an object and a request")
    if size < 0:
        raise ValueError(f"{field} ({size}) must not be negative")
    return size


HOST_PLACEHOLDER = "{host}"


class Origin(BaseModel):
    """One dataset host the cache may contact, and where it really lives.

    `host` is the name clients ask for (`www.cs.toronto.edu`); `upstream` is
    where the node fetches it (`http://www.cs.toronto.edu` in a cluster, a
    local server in tests). Keyed by `host`, so an HTTPS listener with
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
        return None if v is None else _chunk_setting(v, field=info.field_name)

    @field_validator("fill_streams")
    @classmethod
    def _streams(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= 64:
            raise ValueError(f"fill_streams ({v}) must be between 1 and 64")
        return v

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

    @classmethod
    def parse(cls, spec: str) -> "Origin":
        """`HOST=UPSTREAM_URL`, as given to `--origin`."""
        host, sep, upstream = spec.partition("=")
        if not sep:
            raise ValueError(f"--origin wants HOST=UPSTREAM_URL, got {spec!r}")
        return cls(host=host, upstream=upstream)


class _FileSource(PydanticBaseSettingsSource):
    """The --config file, already read and checked by `load`."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_file_settings.get() or {})


class _Base(BaseSettings):
    # forbid: a misspelt key is an error, never a setting silently left at its default.
    model_config = SettingsConfigDict(env_prefix="NEZHA_", extra="forbid", validate_default=True)

    log_level: str = "info"

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        if v.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return v.lower()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))


def _origins(value: Any) -> Any:
    """Origins as a list of HOST=URL strings or objects, a JSON text of either,
    or (the handy form for NEZHA_ORIGINS) `host=url,host2=url2`."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{")):
            try:
                value = json.loads(text)
            except ValueError as e:
                raise ValueError(f"origins: not valid JSON: {e}") from e
        else:
            value = [s.strip() for s in text.split(",") if s.strip()]
    if isinstance(value, dict):
        value = [{"host": h, "upstream": u} for h, u in value.items()]
    return [Origin.parse(v) if isinstance(v, str) else v for v in (value or [])]


class OriginTable:
    """The origins by the name a client asks for: an exact host first, else the
    `*.domain` pattern one label above it (`b1.s3.amazonaws.com` is under
    `*.s3.amazonaws.com`; `a.b1.s3.amazonaws.com` is not, as a TLS wildcard
    certificate would not cover it either)."""

    def __init__(self, origins: list[Origin]) -> None:
        self._exact = {o.host: o for o in origins if not o.wildcard}
        self._under = {o.host[2:]: o for o in origins if o.wildcard}

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


class CacheSettings(_Base):
    """One cache node (`nezha cache`)."""

    listen: str = "127.0.0.1:8080"
    data_dir: Path = Path("./nezha-data")
    origins: Annotated[list[Origin], NoDecode] = Field(default_factory=list)
    capacity: int | None = None
    origin_connect_timeout: float = 5.0
    origin_read_timeout: float = 30.0
    read_size: int = 256 * 1024
    # Send stored objects with sendfile(2); off falls back to read+write
    # (for filesystems or transports without sendfile, and to test both paths).
    sendfile: bool = True
    # Answer plain GET/HEAD hits below aiohttp (cachenode/front/fastpath.py).
    fast_hits: bool = True
    # Cluster membership; all optional so a node runs alone.
    redis_url: str | None = None
    node_id: str | None = None
    advertise: str | None = None
    # Owners per key (replicas-per-key). Unset: 2 for a node in a cluster
    # (redis_url given), so losing one node loses no object and costs no
    # origin fetch; 1 for a node alone, where a second owner cannot exist.
    replicas: int | None = None
    # Connect timeout to peers; a peer silent this long (no headers, or a
    # body that stopped) is probed at /healthz, within this time too, and
    # given up if the probe fails. The rules are in cachenode/front/relay.py.
    peer_timeout: float = 1.0
    # On SIGTERM, a node the ring no longer has (a scale-down) hands its
    # objects to their owners before it exits, for at most this long: set it
    # a few seconds under the pod's terminationGracePeriodSeconds, after
    # which Kubernetes kills it. A node still in the ring (a restart) waits
    # at most `leave_settle` for a ring without it, then exits at once.
    shutdown_grace: float = 25.0
    leave_settle: float = 2.0
    # Shared secret for the internal /_nezha/* endpoints (replicate, hand-off).
    # Without it they answer only to loopback clients.
    cluster_token: str | None = Field(default=None, repr=False)
    stats_flush_interval: float = 1.0
    ring_refresh_interval: float = 5.0
    # A cold fill of an object at least `parallel_fill_threshold` bytes, from
    # an origin that offers byte ranges and a strong validator, fetches
    # `fill_streams` ranges at once (cachenode/fill/parallel.py); 1 turns it off.
    # Per origin in its `origins` entry.
    fill_streams: int = 8
    parallel_fill_threshold: int = 64 * 1024 * 1024
    # A client's Range into a cold large object fetches the slices around it
    # first; on, the rest of the object keeps filling behind it; off, only
    # the slices clients ask for are fetched, kept for later requests
    # (cachenode/fill/parallel.py). Per origin in its `origins` entry.
    fill_on_range: bool = True
    # Range bodies over plain TCP move socket -> pipe -> file by splice(2),
    # never entering Python (cachenode/kernel/splice.py); off, through aiohttp's
    # reader and pwrite. A switch for measuring one against the other.
    splice_fills: bool = True
    # HOST:PORT answering TLS (port 443 behind the chart's Service): a
    # connection naming an origin (SNI) is terminated with the CA below, or
    # relayed untouched to the real host without one; unset: no TLS port.
    tls_listen: str | None = None
    # The Nezha CA (`nezha ca init`): with both, the TLS port terminates
    # configured origins' connections with a leaf it mints per name
    # (cachenode/tls/certificates.py) and caches their https:// objects; without, it
    # relays them untouched. The key file is the cluster's most sensitive
    # secret: only cache pods mount it.
    ca_cert: Path | None = None
    ca_key: Path | None = None
    # A client gets this long from its first byte (or from connecting) to
    # send a complete request head, then 408; trickled heads cannot hold a
    # descriptor for the hour an idle keep-alive connection may stay.
    request_head_timeout: float = 30.0
    # The event loop the node runs on: asyncio's, or uvloop (a separate
    # package) where it measures faster (docs/benchmarks.md).
    event_loop: Literal["asyncio", "uvloop"] = "asyncio"
    # Open client connections at most; unset: derived from the descriptor
    # limit (cachenode/front/connections.py). At the cap the stalest connection
    # that is only waiting for a request is closed, else the new one is
    # answered 503 with Retry-After: accepting never stops.
    max_connections: int | None = None
    # The tier this node asks before the origin (a sidecar's cluster Service,
    # http://HOST[:PORT]): misses, revalidations and every other request for
    # a configured origin go there, marked as a child's; a parent that cannot
    # be reached or answers 5xx is skipped for the origin itself
    # (cachenode/fill/upstream.py). `parent_tls_port` is where the TLS port
    # passes connections it does not terminate: the parent's port 443.
    parent: str | None = None
    parent_tls_port: int = 443
    # How origin names are resolved: `system` (getaddrinfo: /etc/hosts, then
    # DNS) or `dns` (the nameservers, search list and ndots of
    # /etc/resolv.conf, never /etc/hosts; cachenode/fill/dns_resolver.py).
    # Unset: `dns` on a node with a parent, whose pod's /etc/hosts maps the
    # origins' names to the sidecar itself; else `system`. `origin_nameservers`
    # (HOST[:PORT], port 53 by default) replace resolv.conf's nameservers.
    origin_resolver: Literal["system", "dns"] | None = None
    origin_nameservers: list[str] = Field(default_factory=list)
    # HOST:PORT answering /healthz, /readyz and /metrics only: a sidecar's data
    # port is on 127.0.0.1, which the kubelet's probes and Prometheus (sent to
    # the pod's IP) cannot reach. Unset: the admin paths are on `listen` alone.
    admin_listen: str | None = None
    # Hot copies (docs/cache-node.md, "Hot copies"): a node that relays
    # `hot_reads` reads of one object within `hot_window` seconds copies it
    # from an owner and serves it from its own disk; 0 turns them off. They
    # hold at most `hot_share` of `capacity` and are evicted first. hot_reads 3
    # is measured (bench/hot_threshold.py, docs/benchmarks.md "Hot-copy
    # threshold"): fewer copies objects read once or twice, more leaves a hot
    # object's reads on its owners. A minute's window holds a job's workers starting.
    hot_reads: int = 3
    hot_window: float = 60.0
    hot_share: float = 0.1
    # Processes serving this node's port (docs/cache-node.md, "Workers"): one
    # primary that fills, writes and counts, and followers that answer plain
    # hits from the same disk and hand it everything else. "auto": the CPUs
    # the process may use (affinity and cgroup quota), the default, as
    # nginx's `worker_processes auto`. 1: one process, no supervisor.
    workers: int | Literal["auto"] = "auto"
    # Large objects chunked across the ring (docs/cache-node.md, "Chunks"):
    # an object at least `chunk_threshold` long (0: never) is stored as
    # `chunk_size` chunks, each on the owners of its own key. Per origin in
    # its `origins` entry.
    chunk_threshold: int = 2**30
    chunk_size: int = 64 * 2**20

    @field_validator("origins", mode="before")
    @classmethod
    def _parse_origins(cls, v: Any) -> Any:
        return _origins(v)

    @field_validator("hot_reads")
    @classmethod
    def _hot_reads(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"hot_reads ({v}) must be 0 (hot copies off) or more")
        return v

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"workers ({v!r}) must be a number of processes, at least 1, or auto") from None
        if n < 1:
            raise ValueError(f"workers ({n}) must be at least 1, or auto")
        return n

    @field_validator("hot_window")
    @classmethod
    def _hot_window(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"hot_window ({v:g}) must be a positive number of seconds")
        return v

    @field_validator("hot_share")
    @classmethod
    def _hot_share(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(f"hot_share ({v:g}) must be a share of capacity above 0 and at most 1 "
                             f"(use hot_reads 0 to turn hot copies off)")
        return v

    @field_validator("chunk_threshold", "chunk_size", mode="before")
    @classmethod
    def _chunk_sizes(cls, v: Any, info: Any) -> Any:
        return _chunk_setting(v, field=info.field_name)

    def chunking(self, origin: Origin) -> tuple[int, int]:
        """(chunk_threshold, chunk_size) for `origin`'s objects: its own, else this node's."""
        return (self.chunk_threshold if origin.chunk_threshold is None else origin.chunk_threshold,
                self.chunk_size if origin.chunk_size is None else origin.chunk_size)

    @property
    def hot_capacity(self) -> int | None:
        """Bytes hot copies may hold: `hot_share` of `capacity`; None (no bound) without a capacity."""
        return None if self.capacity is None else int(self.capacity * self.hot_share)

    @field_validator("capacity", mode="before")
    @classmethod
    def _capacity(cls, v: Any) -> Any:
        return None if v in (None, "", "0", 0) else parse_size(v)

    @field_validator("parallel_fill_threshold", mode="before")
    @classmethod
    def _fill_threshold(cls, v: Any) -> Any:
        return parse_size(v)

    @field_validator("fill_streams")
    @classmethod
    def _fill_streams(cls, v: int) -> int:
        if not 1 <= v <= 64:
            raise ValueError(f"fill_streams ({v}) must be between 1 and 64")
        return v

    @field_validator("listen", "advertise", "tls_listen", "admin_listen")
    @classmethod
    def _hostport(cls, v: str | None, info: Any) -> str | None:
        if v is not None:
            parse_hostport(v, field=info.field_name)
        return v

    @field_validator("parent")
    @classmethod
    def _parent(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        u = URL(v)
        if u.scheme != "http" or not u.host or u.user or u.password or u.query_string or u.fragment \
                or u.path not in ("", "/"):
            raise ValueError(f"{v!r} must be http://HOST[:PORT] (the cluster Service; plain HTTP, no path, "
                             f"no credentials)")
        return str(u.origin())

    @field_validator("origin_nameservers")
    @classmethod
    def _nameservers(cls, v: list[str]) -> list[str]:
        for server in v:
            parse_hostport(server if ":" in server else f"{server}:53", field="origin_nameservers")
        return v

    @property
    def origin_dns(self) -> bool:
        """Origin names are asked of nameservers, never /etc/hosts (origin_resolver)."""
        return self.origin_resolver == "dns" or (self.origin_resolver is None and self.parent is not None)

    @field_validator("parent_tls_port")
    @classmethod
    def _parent_tls_port(cls, v: int) -> int:
        if not 1 <= v <= 65535:
            raise ValueError(f"{v} is not a TCP port")
        return v

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, v: Path) -> Path:
        if v.exists() and not v.is_dir():
            raise ValueError("exists and is not a folder")
        return v

    @model_validator(mode="after")
    def _check(self) -> "CacheSettings":
        hosts = [o.host for o in self.origins]
        dup = {h for h in hosts if hosts.count(h) > 1}
        if dup:
            raise ValueError(f"origins: host {sorted(dup)[0]!r} is configured twice")
        if self.replicas is None:
            self.replicas = DEFAULT_CLUSTER_REPLICAS if self.redis_url else 1
        if self.replicas < 1:
            raise ValueError(f"replicas ({self.replicas}) must be at least 1")
        if self.peer_timeout <= 0:
            raise ValueError(f"peer_timeout ({self.peer_timeout:g}) must be positive")
        if self.request_head_timeout <= 0:
            raise ValueError(f"request_head_timeout ({self.request_head_timeout:g}) must be positive")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections ({self.max_connections}) must be at least 1")
        if self.origin_connect_timeout <= 0 or self.origin_read_timeout <= 0:
            raise ValueError("origin_connect_timeout and origin_read_timeout must be positive")
        if (self.ca_cert is None) != (self.ca_key is None):
            raise ValueError("ca_cert and ca_key go together: pass both --ca-cert and --ca-key, or neither")
        if not self.origins:
            raise ValueError("no origin configured: pass --origin HOST=UPSTREAM_URL (or NEZHA_ORIGINS, or origins "
                             "in --config); without one the node would refuse every request")
        return self

    @property
    def identity(self) -> str:
        """This node's name in the ring: --node-id, else the address peers use."""
        return self.node_id or self.advertise or self.listen

    @property
    def origin_table(self) -> "OriginTable":
        return OriginTable(self.origins)

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_hostport(self.listen, field="listen")


# Settings of a node that `nezha up` sets for each node itself: never taken from its flags,
# environment or --config (the value names the setting it derives them from).
UP_SETS_PER_NODE = {"listen": "--base-port", "advertise": "--base-port", "node_id": "--nodes",
                    "tls_listen": "--tls-base-port"}


class UpSettings(CacheSettings):
    """A local cluster (`nezha up`): the node settings it gives every node, and its own.

    The node's fields are inherited, not copied: a setting a node takes,
    `nezha up` takes the same way (flag, NEZHA_* variable or --config key)
    and passes on, except the address and name of each node (UP_SETS_PER_NODE).
    `data_dir` holds node i's folder DIR/node-i and the embedded index.
    """

    nodes: int = 3
    # Node i listens on 127.0.0.1:base_port+i and, with tls_base_port, answers TLS on tls_base_port+i.
    base_port: int = 8080
    tls_base_port: int | None = None
    # Replace a ring the index already holds; leave this one's ring in the index on exit.
    force: bool = False
    keep_ring: bool = False
    # Worker processes per node. Not `auto`, as for one node: the nodes share
    # this machine's cores, so N nodes of a worker per core would each
    # contend with the others for every core.
    workers: int | Literal["auto"] = 1

    @model_validator(mode="before")
    @classmethod
    def _replicas_default(cls, data: Any) -> Any:
        """Owners per key unless given: min(2, nodes), so one node can stop without losing an object."""
        if isinstance(data, dict) and data.get("replicas") in (None, ""):
            try:
                nodes = int(data.get("nodes", 3))
            except (TypeError, ValueError):
                return data  # the nodes field reports it
            data = {**data, "replicas": max(1, min(DEFAULT_CLUSTER_REPLICAS, nodes))}
        return data

    @model_validator(mode="after")
    def _check_up(self) -> "UpSettings":
        for name, instead in UP_SETS_PER_NODE.items():
            if name in self.model_fields_set:
                raise ValueError(f"{name} (NEZHA_{name.upper()}, or {name} in --config): nezha up sets it for "
                                 f"each node itself; use {instead}")
        if self.nodes < 1:
            raise ValueError(f"--nodes ({self.nodes}) must be at least 1")
        if self.replicas is not None and self.replicas > self.nodes:
            raise ValueError(f"--replicas {self.replicas}: cannot exceed --nodes ({self.nodes}); each key is kept on "
                             "that many different nodes")
        for flag, base in (("--base-port", self.base_port), ("--tls-base-port", self.tls_base_port)):
            if base is None:
                continue
            last = base + self.nodes - 1
            if base < 1 or last > 65535:
                raise ValueError(f"{flag} {base}: node-{self.nodes - 1} would listen on port {last}, out of range "
                                 f"(a TCP port is 0-65535; nezha up needs {self.nodes} from 1 up)")
        return self

    def node_settings(self) -> dict[str, Any]:
        """What every node gets from these settings, as --config keys: the node's own fields
        that differ from their defaults, without those nezha up sets per node or passes otherwise."""
        passed_otherwise = {"data_dir", "redis_url", "replicas", "cluster_token", "origins", "log_level"}
        keep = set(CacheSettings.model_fields) - set(UP_SETS_PER_NODE) - passed_otherwise
        # workers always: nezha up's default differs from a node's own.
        return {**self.model_dump(mode="json", include=keep, exclude_defaults=True), "workers": self.workers}


class WebhookSettings(_Base):
    """The admission webhook (`nezha webhook`)."""

    listen: str = "127.0.0.1:8443"
    # HOST:PORT serving /metrics over plain HTTP (webhook/metrics.py); none: no listener.
    metrics_listen: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    rules: Path | None = None
    cache_ip: str | None = None
    cache_service: str = "nezha-cache"
    namespace: str = "nezha"
    max_body_bytes: int = 3 * 1024 * 1024
    rules_reload_interval: float = 2.0
    # How often the serving certificate and key files are checked for a renewed pair.
    tls_reload_interval: float = 10.0
    # Learn the cache Service ClusterIP from the API (in-cluster or kubeconfig)
    # while some rule leaves `ip` out and --cache-ip is not given.
    watch_service: bool = True
    # --kubeconfig, NEZHA_KUBECONFIG or KUBECONFIG (as for the controller); none: the pod's service account.
    kubeconfig: Path | None = Field(default=None, validation_alias=AliasChoices(
        "kubeconfig", "NEZHA_KUBECONFIG", "KUBECONFIG"))
    # mode: env rules point HTTP_PROXY here; default http://<cache_service>.<namespace>.svc:80
    proxy_url: str | None = None
    # mode: env rules' NO_PROXY unless a rule sets `noProxy`; None: webhook.patch.DEFAULT_NO_PROXY
    no_proxy: str | None = None
    # The sidecar deployment model (docs/deployment-models.md); checked by
    # webhook/server.py sidecar_config, which knows its forms. No image: pods
    # that ask for a sidecar stay centralized, with nezha.io/status saying why.
    sidecar_image: str | None = None
    sidecar_image_pull_policy: str = "IfNotPresent"
    # The data volume's sizeLimit unless a pod's nezha.io/sidecar-size says otherwise.
    sidecar_size: str = "10Gi"
    sidecar_resources: dict[str, dict[str, str]] = Field(default_factory=lambda: {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}})
    # May a pod choose `sidecar` with nezha.io/deployment? (`centralized` always may.)
    sidecar_by_annotation: bool = True
    # The sidecar's --parent; default http://<cache_service>.<namespace>.svc:80
    sidecar_parent: str | None = None
    # host -> upstream for the sidecar's --origin (a sidecar that cannot reach
    # the cluster fetches from these); a host missing here: http://<host>.
    sidecar_origins: dict[str, str] = Field(default_factory=dict)
    # "1.35": the API server's version, instead of reading it from discovery.
    kubernetes_version: str | None = None
    # `nezha webhook certs`
    webhook_service: str = "nezha-webhook"
    webhook_configuration: str = "nezha-webhook"
    tls_secret: str = "nezha-webhook-tls"
    cert_days: int = 365
    renew_days: int = 30

    @field_validator("listen")
    @classmethod
    def _hostport(cls, v: str) -> str:
        parse_hostport(v, field="listen")
        return v

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen(cls, v: str | None) -> str | None:
        if v is not None:
            parse_hostport(v, field="metrics_listen (--metrics-listen)")
        return v

    @field_validator("cache_ip")
    @classmethod
    def _cache_ip(cls, v: str | None) -> str | None:
        if v is not None:
            import ipaddress

            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"cache_ip {v!r} is not an IP address") from None
        return v

    @model_validator(mode="after")
    def _check(self) -> "WebhookSettings":
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) must be at least 1024")
        if self.rules_reload_interval <= 0 or self.tls_reload_interval <= 0:
            raise ValueError("rules_reload_interval and tls_reload_interval must be positive")
        if not 0 < self.renew_days < self.cert_days:
            raise ValueError(f"renew_days ({self.renew_days}) must be positive and below cert_days "
                             f"({self.cert_days})")
        return self

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_hostport(self.listen, field="listen")

    @property
    def metrics_addr(self) -> tuple[str, int]:
        assert self.metrics_listen is not None
        return parse_hostport(self.metrics_listen, field="metrics_listen")

    @property
    def cache_proxy_url(self) -> str:
        return self.proxy_url or f"http://{self.cache_service}.{self.namespace}.svc:80"

    @property
    def sidecar_parent_url(self) -> str:
        return self.sidecar_parent or f"http://{self.cache_service}.{self.namespace}.svc:80"


def _setting_names(cls: type[_Base]) -> dict[str, str]:
    """Every name a setting of `cls` answers to in a file or the environment -> its field."""
    names: dict[str, str] = {}
    for field, info in cls.model_fields.items():
        names[field] = field
        names[f"NEZHA_{field.upper()}"] = field
        alias = info.validation_alias
        for choice in getattr(alias, "choices", ()) or ():
            if isinstance(choice, str):
                names[choice] = field
    return names


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _read_file(path: Path, cls: type[_Base]) -> tuple[dict[str, Any], list[str]]:
    """The --config file's mapping, and a line for each unknown key in it."""
    where = f"--config {path}"
    if not path.is_file():
        raise ConfigError(f"{where}: does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{where}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot be read: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping of setting names to values, got {type(data).__name__}")
    fields = list(cls.model_fields)
    problems = [f"{where}: unknown key {k!r}{_did_you_mean(str(k), fields)}" for k in data if k not in fields]
    return data, problems


def _env_problems(cls: type[_Base], command: str) -> list[str]:
    """A NEZHA_* variable that no Nezha command reads is a typo. One that another command reads
    is left alone: a pod's environment serves every command run in it (`kubectl exec nezha-cache-0
    -- nezha stats` sees the node's NEZHA_CLUSTER_TOKEN)."""
    ours = [n for n in _setting_names(cls) if n.startswith("NEZHA_")]
    anyone = {n for sub in _settings_classes() for n in _setting_names(sub) if n.startswith("NEZHA_")}
    return [f"{name}: not a setting of {command} or any other nezha command{_did_you_mean(name, ours)}"
            for name in sorted(os.environ)
            if name.startswith("NEZHA_") and not name.startswith(_TEST_VARIABLES) and name not in anyone]


def _settings_classes() -> list[type[_Base]]:
    found, todo = [], list(_Base.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def _source(field: str, given: dict[str, Any], file: dict[str, Any], path: Path | None) -> str:
    """Where a field's value came from, as the user would write it."""
    if field in given:
        return FLAG_NAMES.get(field, "--" + field.replace("_", "-"))
    env = f"NEZHA_{field.upper()}"
    if env in os.environ:
        return env
    if field in file:
        return f"{field} in {path}"
    return field


def load(cls: type[_Base], *, flags: dict[str, Any] | None = None, config_file: Path | None = None,
         command: str | None = None) -> Any:
    """Build settings of `cls` from flags, environment and an optional YAML file.

    Flags that were not given (None) do not mask the environment. Every
    problem comes back in one ConfigError, one line each, naming the flag,
    variable or file key and the value: a bad value, an unknown key in the
    file, a `NEZHA_*` variable that is no setting of this command (with a
    "did you mean" when one is close).
    """
    from pydantic import ValidationError

    command = command or COMMAND
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    path = Path(config_file) if config_file else None
    file, problems = _read_file(path, cls) if path is not None else ({}, [])
    problems += _env_problems(cls, command)
    if problems:
        raise ConfigError("\n".join(problems))
    token = _file_settings.set(file)
    try:
        return cls(**given)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = [str(p) for p in err["loc"]]
            message = re.sub(r"^(Value|Assertion) error, ", "", err["msg"])
            if not loc:
                lines.append(message)
                continue
            inner = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
            source = _source(loc[0], given, file, path)
            # "origins[0].ttl in nezha.yaml", not "origins in nezha.yaml[0].ttl"
            where = (loc[0] + inner + source[len(loc[0]):]) if source.startswith(loc[0] + " in ") \
                else source + inner
            if err["type"] == "extra_forbidden" and loc[0] == "origins":
                lines.append(f"{where}: unknown key in an origin{_did_you_mean(loc[-1], list(Origin.model_fields))}")
                continue
            value = err.get("input")
            if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
                # A repeated flag (--origin a --origin b) as the user typed it, not a Python list.
                shown = "".join(f" {str(v)!r}" for v in value)
            else:
                shown = "" if isinstance(value, (dict, list, tuple)) or value is None else \
                    f" {str(value)!r}" if isinstance(value, Path) else f" {value!r}"
            lines.append(f"{where}{shown}: {message}")
        raise ConfigError("\n".join(lines)) from e
    except SettingsError as e:
        raise ConfigError(f"{e}: {e.__cause__}") from e
    finally:
        _file_settings.reset(token)


class ClusterSettings(_Base):
    """Cluster-wide commands (`nezha ring`, `nezha stats`): where the shared index is."""

    redis_url: str | None = None

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        return check_redis_url(v)


class ControllerSettings(_Base):
    """The controller (`nezha controller`): which cache StatefulSet it runs, and how.

    Durations follow controller-runtime's leader election defaults and are
    checked at start-up, naming the fields: a lease shorter than the renew
    deadline could be taken while its holder still believes it leads.
    """

    namespace: str | None = None
    statefulset: str | None = None
    redis_url: str | None = None
    identity: str | None = None  # this replica's name in the Lease; default: the host (pod) name
    # --kubeconfig, NEZHA_KUBECONFIG or KUBECONFIG; none: the pod's service account.
    kubeconfig: Path | None = Field(default=None, validation_alias=AliasChoices(
        "kubeconfig", "NEZHA_KUBECONFIG", "KUBECONFIG"))
    lease_name: str = "nezha-controller"
    peer_address: str = "dns"  # dns: <pod>.<serviceName>.<ns>.svc:<port>; pod-ip: <podIP>:<port>
    peer_port: int = 8080  # when the cache container has no port named http
    cluster_token_file: Path | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # A change of pods or StatefulSet is written to the ring at most this long after it arrives;
    # changes within it share one write.
    batch_window: float = 0.05
    # HOST:PORT of /healthz and /readyz (kubelet probes); none: no listener.
    health_listen: str | None = None
    # Keep a copy of ConfigMap nezha-ca (the CA bundle labelled pods mount for
    # HTTPS, `nezha ca init`) in every namespace (controller/trust.py).
    publish_ca: bool = False
    # The cache nodes' origin table (the chart mounts the nodes' own file): the
    # controller keys a prefetched URL with its origin's rules (volatile_params),
    # so it asks the node that stores it under that key.
    origins: Annotated[list[Origin], NoDecode] = Field(default_factory=list)

    @field_validator("origins", mode="before")
    @classmethod
    def _parse_origins(cls, v: Any) -> Any:
        return _origins(v)

    @field_validator("health_listen")
    @classmethod
    def _health_listen(cls, v: str | None) -> str | None:
        if v is not None:
            parse_hostport(v, field="health_listen (--health-listen)")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        return check_redis_url(v)

    @field_validator("peer_address")
    @classmethod
    def _peer_address(cls, v: str) -> str:
        if v not in ("dns", "pod-ip"):
            raise ValueError(f"peer_address must be dns or pod-ip (--peer-address), got {v!r}")
        return v

    @field_validator("namespace", "statefulset", "lease_name")
    @classmethod
    def _dns_label(cls, v: str | None, info) -> str | None:
        if v is not None and not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", v):
            raise ValueError(f"{info.field_name} {v!r} is not a Kubernetes object name "
                             f"(--{info.field_name.replace('_', '-')})")
        return v

    @model_validator(mode="after")
    def _check(self) -> "ControllerSettings":
        for name in ("namespace", "statefulset", "redis_url"):
            if getattr(self, name) is None:
                flag = name.replace("_", "-")
                raise ValueError(f"--{flag} is required (or NEZHA_{name.upper()}, or {name} in --config)")
        if not 0 < self.peer_port < 65536:
            raise ValueError(f"peer_port ({self.peer_port}) must be a TCP port (--peer-port)")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"leader election needs 0 < retry_period ({self.retry_period:g}s) < renew_deadline "
                f"({self.renew_deadline:g}s) < lease_duration ({self.lease_duration:g}s)")
        if self.batch_window < 0 or self.batch_window > 1:
            raise ValueError(f"batch_window ({self.batch_window:g}s) must be between 0 and 1 s")
        if self.kubeconfig is not None and not self.kubeconfig.is_file():
            raise ValueError(f"kubeconfig {self.kubeconfig} does not exist (--kubeconfig or KUBECONFIG)")
        if self.cluster_token_file is not None and not self.cluster_token_file.is_file():
            raise ValueError(f"cluster_token_file {self.cluster_token_file} does not exist (--cluster-token-file)")
        return self

    @property
    def origin_table(self) -> OriginTable:
        return OriginTable(self.origins)

    @property
    def holder(self) -> str:
        if self.identity:
            return self.identity
        import socket

        return socket.gethostname()

    @property
    def cluster_token(self) -> str | None:
        if self.cluster_token_file is None:
            return None
        return self.cluster_token_file.read_text().strip() or None
