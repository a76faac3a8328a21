"""`nezha cache`: one node's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode
from yarl import URL

from nezha.config.base import NezhaSettings
from nezha.config.flags import Flag
from nezha.origins import Origin, OriginTable, check_fill_streams, parse_origins
from nezha.values import chunk_setting, parse_hostport, parse_size

# Owners per key in a cluster unless configured: one node can go away (a
# crash, a drain, a rolling restart) without an object being lost or fetched
# again from the origin.
DEFAULT_CLUSTER_REPLICAS = 2
# What replaced the node's own DNS client (origin_resolver, origin_nameservers).
_OWN_HOSTS = ("origin names are found the system's way; a sidecar's /etc/hosts is its own, made by the webhook "
              "and naming no origin (docs/deployment-models.md, \"How a sidecar finds the origins\")")


class CacheSettings(NezhaSettings):
    """One cache node (`nezha cache`)."""

    removed: ClassVar[dict[str, str]] = {
        "origin_resolver": f"removed: {_OWN_HOSTS}",
        "origin_nameservers": f"removed: {_OWN_HOSTS}; the nameservers are those of /etc/resolv.conf",
    }

    listen: Annotated[str, Flag(only=("cache",))] = Field("127.0.0.1:8080", description="HOST:PORT to serve on")
    data_dir: Annotated[Path, Flag()] = Field(Path("./nezha-data"), description="folder for cached objects")
    origins: Annotated[list[Origin], NoDecode, Flag(name="--origin", metavar="HOST=UPSTREAM_URL")] = Field(
        default_factory=list, description="a dataset host and where to fetch it; repeat for more")
    capacity: Annotated[int | None, Flag(size=True)] = Field(None, description=(
        "disk to use, e.g. 50GiB or 500M; least recently used objects are evicted beyond it (default: unbounded)"))
    origin_connect_timeout: float = 5.0
    origin_read_timeout: float = 30.0
    read_size: int = 256 * 1024
    # Send stored objects with sendfile(2); off falls back to read+write
    # (for filesystems or transports without sendfile, and to test both paths).
    sendfile: bool = True
    # Answer plain GET/HEAD hits below aiohttp (cachenode/front/fastpath.py).
    fast_hits: bool = True
    # Cluster membership; all optional so a node runs alone.
    redis_url: Annotated[str | None, Flag()] = Field(None, description=(
        "the shared index to join: redis://, rediss://, unix:// or redis+sentinel:// (needs NEZHA_CLUSTER_TOKEN; "
        "default: none, a lone node)"))
    node_id: Annotated[str | None, Flag(only=("cache",))] = Field(None, description="this node's identity in the ring")
    advertise: Annotated[str | None, Flag(only=("cache",))] = Field(None, description=(
        "HOST:PORT where peers reach this node, shown in /readyz and sent with copies; the ring itself is written "
        "by the controller, `nezha up` or `nezha ring set` (default: --listen)"))
    # Owners per key (replicas-per-key). Unset: 2 for a node in a cluster
    # (redis_url given), so losing one node loses no object and costs no
    # origin fetch; 1 for a node alone, where a second owner cannot exist.
    replicas: Annotated[int | None, Flag()] = Field(None, description=(
        f"owners per key (replicas-per-key); default {DEFAULT_CLUSTER_REPLICAS} with --redis-url, else 1"))
    # Connect timeout to peers; a peer silent this long (no headers, or a
    # body that stopped) is probed at /healthz, within this time too, and
    # given up if the probe fails. The rules are in cachenode/front/relay.py.
    peer_timeout: float = 1.0
    # Small objects' replicas travel to each other owner in batches of up to
    # this many, one request each (cachenode/cluster/replica_batches.py);
    # 0 copies each replica in a request of its own, as large objects are.
    replica_batch: int = 64
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
    fill_streams: Annotated[int, Flag(only=("cache",))] = Field(8, description=(
        "parallel range requests for a cold fill of a large object (at least parallel_fill_threshold) from an "
        "origin that offers ranges and a strong validator; 1 fetches every object as one stream; per origin in "
        "--config"))
    parallel_fill_threshold: int = 64 * 1024 * 1024
    # Objects up to `small_object_max` bytes are stored as one sealed file,
    # written on the event loop without an fsync of their own and made
    # durable together every `sync_interval` seconds (docs/cache-node.md,
    # "Small objects"); 0 stores every object as a large one.
    small_object_max: int = Field(128 * 1024, ge=0, le=16 * 1024 * 1024)
    sync_interval: float = Field(1.0, gt=0)
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
    tls_listen: Annotated[str | None, Flag(only=("cache",))] = Field(None, description=(
        "HOST:PORT for TLS clients of aliased hosts (port 443 in a cluster): a connection whose server name (SNI) "
        "is a configured origin is served here with a certificate for that name signed by --ca-cert, or without "
        "a CA passed untouched to the real host; any other name is refused (default: none)"))
    # The Nezha CA (`nezha ca init`): with both, the TLS port terminates
    # configured origins' connections with a leaf it mints per name
    # (cachenode/tls/certificates.py) and caches their https:// objects; without, it
    # relays them untouched. The key file is the cluster's most sensitive
    # secret: only cache pods mount it.
    ca_cert: Annotated[Path | None, Flag()] = Field(None, description=(
        "the Nezha CA's certificate (nezha ca init), which labelled pods trust; with --ca-key the TLS port serves "
        "configured origins itself (default: none)"))
    ca_key: Annotated[Path | None, Flag()] = Field(None, description=(
        "the Nezha CA's private key: keep it readable by the node only (default: none)"))
    # A client gets this long from its first byte (or from connecting) to
    # send a complete request head, then 408; trickled heads cannot hold a
    # descriptor for the hour an idle keep-alive connection may stay.
    request_head_timeout: Annotated[float, Flag(only=("cache",))] = Field(30.0, description=(
        "seconds a client has to send a complete request head, then 408"))
    # The event loop the node runs on: asyncio's, or uvloop (a separate
    # package) where it measures faster (docs/benchmarks.md).
    event_loop: Literal["asyncio", "uvloop"] = "asyncio"
    # Open client connections at most; unset: derived from the descriptor
    # limit (cachenode/front/connections.py). At the cap the stalest connection
    # that is only waiting for a request is closed, else the new one is
    # answered 503 with Retry-After: accepting never stops.
    max_connections: Annotated[int | None, Flag(only=("cache",))] = Field(None, description=(
        "open client connections at most; beyond it the stalest idle one is closed, else the newcomer gets 503 "
        "with Retry-After (default: from the open-files limit, which the node raises to its hard limit)"))
    # The tier this node asks before the origin (a sidecar's cluster Service,
    # http://HOST[:PORT]): misses, revalidations and every other request for
    # a configured origin go there, marked as a child's; a parent that cannot
    # be reached or answers 5xx is skipped for the origin itself
    # (cachenode/fill/upstream.py). `parent_tls_port` is where the TLS port
    # passes connections it does not terminate: the parent's port 443.
    parent: Annotated[str | None, Flag(only=("cache",))] = Field(None, description=(
        "http://HOST[:PORT] of the tier above this node (a sidecar's cluster Service): misses and revalidations "
        "for configured origins go there, and to the origin only when the parent cannot be reached or answers "
        "5xx (default: none, the origin)"))
    parent_tls_port: Annotated[int, Flag(only=("cache",))] = Field(443, description=(
        "the parent's TLS port, where --tls-listen passes the connections it does not terminate, by their server "
        "name"))
    # HOST:PORT answering /healthz, /readyz and /metrics only: a sidecar's data
    # port is on 127.0.0.1, which the kubelet's probes and Prometheus (sent to
    # the pod's IP) cannot reach. Unset: the admin paths are on `listen` alone.
    admin_listen: Annotated[str | None, Flag(only=("cache",))] = Field(None, description=(
        "HOST:PORT answering /healthz, /readyz and /metrics only, for probes and scraping when --listen is on "
        "loopback, as a sidecar's is (default: none)"))
    # Hot copies (docs/cache-node.md, "Hot copies"): a node that relays
    # `hot_reads` reads of one object within `hot_window` seconds copies it
    # from an owner and serves it from its own disk; 0 turns them off. They
    # hold at most `hot_share` of `capacity` and are evicted first. hot_reads 3
    # is measured (bench/hot_threshold.py, docs/benchmarks.md "Hot-copy
    # threshold"): fewer copies objects read once or twice, more leaves a hot
    # object's reads on its owners. A minute's window holds a job's workers starting.
    hot_reads: Annotated[int, Flag()] = Field(3, description=(
        "relayed reads of one object within --hot-window that make it hot on this node, which then copies it "
        "from an owner and serves it from its own disk; 0 turns hot copies off"))
    hot_window: Annotated[float, Flag()] = Field(60.0, description=(
        "seconds in which --hot-reads relayed reads make an object hot"))
    hot_share: Annotated[float, Flag()] = Field(0.1, description=(
        "share of --capacity hot copies may hold; they are evicted first, least recently used among them"))
    # Prefetched objects kept from eviction for the workloads that asked
    # (cachenode/store/pins.py, docs/controller.md "Kept while used").
    pinned_share: Annotated[float, Flag()] = Field(0.5, description=(
        "share of --capacity that objects pinned for workloads' prefetches may hold; pins beyond it are refused"))
    # Prefetch fills (requests the controller marks X-Nezha-Prefetch) run at a
    # lower priority than live requests (cachenode/front/pacing.py,
    # docs/controller.md "Pacing"): at most `prefetch_busy_fills` at a time
    # while live requests come in (one within `prefetch_quiet` seconds), at most
    # `prefetch_idle_fills` otherwise; the others wait on the node. 1 is
    # measured (bench/prefetch.py, docs/benchmarks.md "Prefetch by manifest").
    prefetch_busy_fills: Annotated[int, Flag()] = Field(1, description=(
        "prefetch fills this node runs at a time while it serves live requests; the controller's others wait"))
    prefetch_idle_fills: Annotated[int, Flag()] = Field(64, description=(
        "prefetch fills this node runs at a time while no live request comes in"))
    prefetch_quiet: Annotated[float, Flag()] = Field(0.25, description=(
        "seconds without a live request after which this node runs --prefetch-idle-fills prefetch fills at a time"))
    # Processes serving this node's port (docs/cache-node.md, "Workers"): one
    # primary that fills, writes and counts, and followers that answer plain
    # hits from the same disk and hand it everything else. "auto": the CPUs
    # the process may use (affinity and cgroup quota; bounded by memory.max
    # and a ceiling, cachenode/workers/plan.py), the default, as nginx's
    # `worker_processes auto`. 1: one process, no supervisor.
    workers: Annotated[int | Literal["auto"], Flag()] = Field("auto", description=(
        "processes serving this node's port: one fills, writes and counts, the others answer plain hits from the "
        "same disk and hand it the rest; a number, or auto: the CPUs this process may use, from its affinity and "
        "cgroup quota, no more than its cgroup's memory limit holds at 96 MiB a worker, and at most 16. "
        "1: a single process"))
    # Large objects chunked across the ring (docs/cache-node.md, "Chunks"):
    # an object at least `chunk_threshold` long (0: never) is stored as
    # `chunk_size` chunks, each on the owners of its own key. Per origin in
    # its `origins` entry.
    chunk_threshold: Annotated[int, Flag(size=True)] = Field(2**30, description=(
        "objects at least this large (e.g. 1GiB) are stored as chunks spread over the ring, each on the owners "
        "of its own key; 0 turns chunking off; per origin: chunk_threshold"))
    chunk_size: Annotated[int, Flag(size=True)] = Field(64 * 2**20, description=(
        "size of those chunks, e.g. 64MiB; per origin: chunk_size"))
    # Bytes at rest checked against the node's own checksum (issue 37 item 3,
    # docs/cache-node.md "Verified bytes"): every read from disk before its
    # bytes leave (`verify_reads`; off by default: the check costs about 10%
    # of a warm large read and takes large hits off the fast path,
    # docs/benchmarks.md), and every stored object re-read once per
    # `scrub_interval` seconds (0: never) at most `scrub_rate` bytes a second.
    verify_reads: Annotated[bool, Flag()] = Field(False, description=(
        "check every read from disk against the node's own checksum before its bytes leave; a corrupt object is "
        "removed and fetched again (default: off; docs/benchmarks.md gives its cost)"))
    # With --workers, a follower leads a plain small cold miss itself, on the
    # primary's grant (cachenode/workers/follower_leads.py), instead of
    # handing it to the primary, which otherwise does every fill. Off by
    # default: it costs a grant's round trip between the two processes and
    # about 30 us of CPU a fill, which pays where the primary's CPU limits
    # cold fills and not on a box whose cores the load shares
    # (docs/benchmarks.md, "Followers leading small cold fills").
    follower_leads: Annotated[bool, Flag(only=("cache",))] = Field(False, description=(
        "with --workers, followers fill plain small cold misses themselves on the primary's grant instead of "
        "handing them over; pays where the primary's CPU limits cold fills (default: off; docs/benchmarks.md)"))
    # A plain cold small miss the fast path leads (front/fast_misses.py) asks
    # an origin whose recent fills were small on the node's own connections
    # (cachenode/fill/small_gets.py) rather than through aiohttp; anything but
    # a small whole 200 is asked again the usual way (docs/cache-node.md,
    # "Small gets"). On by default: 5-8% less node CPU per cold small fill,
    # 7 of 8 pairs over two runs (docs/benchmarks.md, 2026-11-29);
    # --no-small-gets turns it off.
    small_gets: Annotated[bool, Flag(only=("cache",))] = Field(True, description=(
        "ask plain http:// origins whose recent fills were small on the node's own connections, asking again "
        "through the general client for anything but a small whole 200 (default: on; docs/benchmarks.md)"))
    scrub_interval: Annotated[float, Flag()] = Field(7 * 24 * 3600.0, ge=0, description=(
        "seconds in which a background scrub re-reads every stored object once and removes the corrupt ones; "
        "0 turns it off (default: a week)"))
    scrub_rate: Annotated[int, Flag(size=True)] = Field(32 * 2**20, gt=0, description=(
        "bytes a second the scrub reads at most, e.g. 32MiB"))

    @field_validator("origins", mode="before")
    @classmethod
    def _parse_origins(cls, v: Any) -> Any:
        return parse_origins(v)

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

    @field_validator("hot_window", "prefetch_quiet")
    @classmethod
    def _seconds(cls, v: float, info: Any) -> float:
        if not v > 0:
            raise ValueError(f"{info.field_name} ({v:g}) must be a positive number of seconds")
        return v

    @field_validator("hot_share")
    @classmethod
    def _hot_share(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(f"hot_share ({v:g}) must be a share of capacity above 0 and at most 1 "
                             f"(use hot_reads 0 to turn hot copies off)")
        return v

    @field_validator("pinned_share")
    @classmethod
    def _pinned_share(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"pinned_share ({v:g}) must be at least 0 and below 1: a node full of pins stores nothing")
        return v

    @field_validator("scrub_rate", mode="before")
    @classmethod
    def _scrub_rate(cls, v: Any) -> Any:
        return parse_size(v)

    @field_validator("prefetch_busy_fills", "prefetch_idle_fills")
    @classmethod
    def _prefetch_fills(cls, v: int, info: Any) -> int:
        if v < 1:
            raise ValueError(f"{info.field_name} ({v}) must be at least 1: a prefetch that may never run never ends")
        return v

    @field_validator("chunk_threshold", "chunk_size", mode="before")
    @classmethod
    def _chunk_sizes(cls, v: Any, info: Any) -> Any:
        return chunk_setting(v, field=info.field_name)

    def chunking(self, origin: Origin) -> tuple[int, int]:
        """(chunk_threshold, chunk_size) for `origin`'s objects: its own, else this node's."""
        return (self.chunk_threshold if origin.chunk_threshold is None else origin.chunk_threshold,
                self.chunk_size if origin.chunk_size is None else origin.chunk_size)

    @property
    def hot_capacity(self) -> int | None:
        """Bytes hot copies may hold: `hot_share` of `capacity`; None (no bound) without a capacity."""
        return None if self.capacity is None else int(self.capacity * self.hot_share)

    @property
    def pinned_capacity(self) -> int | None:
        """Bytes pins may hold: `pinned_share` of `capacity`; None (no bound) without a capacity."""
        return None if self.capacity is None else int(self.capacity * self.pinned_share)

    @field_validator("capacity", mode="before")
    @classmethod
    def _capacity(cls, v: Any) -> Any:
        return None if v in (None, "", "0", 0) else parse_size(v)

    @field_validator("parallel_fill_threshold", "small_object_max", mode="before")
    @classmethod
    def _fill_threshold(cls, v: Any) -> Any:
        return parse_size(v)

    @field_validator("fill_streams")
    @classmethod
    def _fill_streams(cls, v: int) -> int:
        return check_fill_streams(v)

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
        if self.replica_batch < 0:
            raise ValueError(f"replica_batch ({self.replica_batch}) must be 0 (off) or more")
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
