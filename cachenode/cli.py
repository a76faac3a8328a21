"""`nezha cache`: one node."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path

import structlog

from nezha.config import CacheSettings, load, parse_hostport
from nezha.errors import ConfigError
from nezha.folder_lock import hold
from nezha.logs import configure


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="run one cache node")
    p.add_argument("--listen", help="HOST:PORT to serve on (default 127.0.0.1:8080)")
    p.add_argument("--data-dir", type=Path, help="folder for cached objects (default ./nezha-data)")
    p.add_argument("--origin", action="append", dest="origins", metavar="HOST=UPSTREAM_URL",
                   help="a dataset host and where to fetch it; repeat for more")
    p.add_argument("--capacity", help="disk to use, e.g. 50GiB or 500M; least recently used objects are evicted "
                   "beyond it (default: unbounded)")
    p.add_argument("--redis-url", help="the shared index to join: redis://, rediss://, unix:// or "
                   "redis+sentinel:// (needs NEZHA_CLUSTER_TOKEN; default: none, a lone node)")
    p.add_argument("--node-id", help="this node's identity in the ring")
    p.add_argument("--advertise", help="HOST:PORT where peers reach this node, shown in /readyz and sent with "
                   "copies; the ring itself is written by the controller, `nezha up` or `nezha ring set` "
                   "(default: --listen)")
    p.add_argument("--replicas", type=int, help="owners per key (replicas-per-key); default 2 with --redis-url, "
                   "else 1")
    p.add_argument("--tls-listen", help="HOST:PORT for TLS clients of aliased hosts (port 443 in a cluster): a "
                   "connection whose server name (SNI) is a configured origin is served here with a certificate "
                   "for that name signed by --ca-cert, or without a CA passed untouched to the real host; any "
                   "other name is refused (default: none)")
    p.add_argument("--ca-cert", type=Path, help="the Nezha CA's certificate (nezha ca init), which labelled pods "
                   "trust; with --ca-key the TLS port serves configured origins itself (default: none)")
    p.add_argument("--ca-key", type=Path, help="the Nezha CA's private key: keep it readable by the node only "
                   "(default: none)")
    p.add_argument("--fill-streams", type=int, help="parallel range requests for a cold fill of a large object "
                   "(at least parallel_fill_threshold, default 64MiB) from an origin that offers ranges and a "
                   "strong validator; 1 fetches every object as one stream (default 8; per origin in --config)")
    p.add_argument("--max-connections", type=int, help="open client connections at most; beyond it the "
                   "stalest idle one is closed, else the newcomer gets 503 with Retry-After (default: from "
                   "the open-files limit, which the node raises to its hard limit)")
    p.add_argument("--request-head-timeout", type=float, help="seconds a client has to send a complete "
                   "request head, then 408 (default 30)")
    p.add_argument("--parent", help="http://HOST[:PORT] of the tier above this node (a sidecar's cluster "
                   "Service): misses and revalidations for configured origins go there, and to the origin only "
                   "when the parent cannot be reached or answers 5xx (default: none, the origin)")
    p.add_argument("--parent-tls-port", type=int, help="the parent's TLS port, where --tls-listen passes the "
                   "connections it does not terminate, by their server name (default 443)")
    p.add_argument("--admin-listen", help="HOST:PORT answering /healthz, /readyz and /metrics only, for probes "
                   "and scraping when --listen is on loopback, as a sidecar's is (default: none)")
    p.add_argument("--hot-reads", type=int, help="relayed reads of one object within --hot-window that make "
                   "it hot on this node, which then copies it from an owner and serves it from its own disk; 0 "
                   "turns hot copies off (default 3)")
    p.add_argument("--hot-window", type=float, help="seconds in which --hot-reads relayed reads make an object "
                   "hot (default 60)")
    p.add_argument("--hot-share", type=float, help="share of --capacity hot copies may hold; they are evicted "
                   "first, least recently used among them (default 0.1)")
    p.add_argument("--workers", help="processes serving this node's port: one fills, writes and counts, the "
                   "others answer plain hits from the same disk and hand it the rest; a number or auto (the "
                   "CPUs this process may use, from its affinity and cgroup quota; the default). 1: a single process")
    p.add_argument("--chunk-threshold", help="objects at least this large (e.g. 1GiB) are stored as chunks "
                   "spread over the ring, each on the owners of its own key; 0 turns chunking off (default 1GiB; "
                   "per origin: chunk_threshold)")
    p.add_argument("--chunk-size", help="size of those chunks, e.g. 64MiB (default 64MiB; per origin: chunk_size)")
    p.add_argument("--config", type=Path, help="YAML file of settings")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error", "critical"],
                   help="default info")
    p.set_defaults(func=run_cache)


def _flags(args: argparse.Namespace, names: list[str]) -> dict:
    return {n: getattr(args, n, None) for n in names}


def run_cache(args: argparse.Namespace) -> int:
    # The node's modules (aiohttp, the store, prometheus, ...) are imported below only where
    # a node runs here: the supervisor of several workers needs none of them (supervisor.py).
    from cachenode.workers import supervisor

    settings = load(CacheSettings, config_file=args.config, flags=_flags(
        args, ["listen", "data_dir", "origins", "capacity", "redis_url", "node_id", "advertise",
               "replicas", "tls_listen", "ca_cert", "ca_key", "fill_streams", "max_connections", "request_head_timeout", "parent",
               "parent_tls_port", "admin_listen", "hot_reads", "hot_window", "hot_share", "chunk_threshold", "chunk_size",
               "workers", "log_level"]))
    if settings.redis_url and not settings.cluster_token:
        raise ConfigError("a node that joins a cluster (--redis-url) needs the cluster token its peers share: set "
                          "NEZHA_CLUSTER_TOKEN (or cluster_token in --config); without it any local client could "
                          "drive its internal endpoints")
    ca = None
    if settings.ca_cert is not None and settings.ca_key is not None:
        from cachenode.app import read_ca

        ca = read_ca(settings)  # like every setting, checked before anything is made or bound
    run = asyncio.run
    if settings.event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise ConfigError("event_loop is uvloop (NEZHA_EVENT_LOOP, or event_loop in --config), but the uvloop "
                              "package is not installed: pip install uvloop") from None
        run = uvloop.run
    prepare_data_dir(settings.data_dir)
    configure(level=settings.log_level, cache_loggers=True,
              credential_params=[name for o in settings.origins for name in o.credential_params])
    role = os.environ.get(supervisor.ROLE_ENV)
    if role is None:
        # One node per data folder, held until this process (and with workers, the last of them) ends.
        lock = hold(settings.data_dir, command="nezha cache")
        workers = worker_count(settings.workers)
        if workers > 1:
            tls = None if settings.tls_listen is None else parse_hostport(settings.tls_listen, field="tls_listen")
            return supervisor.supervise(getattr(args, "argv", None) or sys.argv[1:], workers,
                                        {"listen": settings.listen_addr, "tls_listen": tls}, keep_fds=(lock,),
                                        log_level=settings.log_level)
        from cachenode.app import serve

        run(serve(settings, ca=ca))
        return 0
    # Port 0 in the settings: the one the supervisor chose for every worker.
    settings = settings.model_copy(update=supervisor.shared_addresses(os.environ))
    link = socket.socket(fileno=int(os.environ[supervisor.LINK_ENV]))
    index = int(os.environ.get(supervisor.INDEX_ENV, "0"))
    structlog.contextvars.bind_contextvars(worker=index)
    from cachenode.app import serve
    from cachenode.front.connections import raise_open_files_limit
    from cachenode.workers.follower import serve_follower
    from cachenode.workers.primary import attach_followers

    if role == "primary":
        run(serve(settings, ca=ca, reuse_port=True, attach=attach_followers(link)))
        return 0
    return run(serve_follower(settings, link=link, worker=index, open_files=raise_open_files_limit()))


# Where the cgroup's limits are read: v2 first, then v1's memory controller.
CPU_MAX_FILES = (Path("/sys/fs/cgroup/cpu.max"),)
MEMORY_MAX_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def _first_readable(paths: tuple[Path, ...]) -> str | None:
    for path in paths:
        try:
            return path.read_text()
        except OSError:
            continue
    return None


def worker_count(workers: int | str) -> int:
    """`workers`, with auto resolved from this process's affinity, its cgroup's
    CPU quota and memory limit (cachenode/workers/plan.py)."""
    from cachenode.workers.plan import auto_workers

    if workers != "auto":
        return int(workers)
    return auto_workers(affinity=len(os.sched_getaffinity(0)), cpu_max=_first_readable(CPU_MAX_FILES),
                        memory_max=_first_readable(MEMORY_MAX_FILES))


def prepare_data_dir(path: Path) -> None:
    """The data folder, made now (after every other setting was checked) or refused naming --data-dir."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--data-dir {str(path)!r}: cannot be created: {e.strerror}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--data-dir {str(path)!r}: not writable by this user")
