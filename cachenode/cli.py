"""`nezha cache` (one node) and `nezha demo` (the first thing a user runs)."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from nezha.config import CacheSettings, load
from nezha.errors import ConfigError
from nezha.lifecycle import stop_on_signals
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
    p.add_argument("--config", type=Path, help="YAML file of settings")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error", "critical"],
                   help="default info")
    p.set_defaults(func=run_cache)

    u = sub.add_parser(
        "up", help="run a local cache cluster of node processes",
        description="Start NODES cache node processes on this machine, publish their ring in the index and "
                    "serve until SIGINT/SIGTERM, which stops every node. The set of nodes is fixed while it "
                    "runs: nezha up never adds or removes a node, so it never needs to drain one (a program "
                    "that removes nodes uses LocalCluster.remove, which drains first). Cached objects stay "
                    "in DIR/node-i for the next run.")
    u.add_argument("--nodes", type=int, default=3, help="node processes (default 3)")
    u.add_argument("--origin", action="append", dest="origins", metavar="HOST=UPSTREAM_URL", required=True,
                   help="a dataset host and where to fetch it; repeat for more")
    u.add_argument("--base-port", type=int, default=8080, help="node i listens on 127.0.0.1:BASE+i (default 8080)")
    u.add_argument("--data-dir", type=Path, default=Path("./nezha-data"),
                   help="node i uses DIR/node-i (default ./nezha-data)")
    u.add_argument("--replicas", type=int, default=None,
                   help="owners per key (default min(2, NODES): any one node can stop without losing an object)")
    u.add_argument("--redis-url", help="index to use; default: an embedded one in DIR/index")
    u.add_argument("--force", action="store_true", help="replace a ring the index already holds (one this "
                   "command did not write); without it nezha up refuses")
    u.add_argument("--keep-ring", action="store_true", help="leave the ring in the index on exit (default: "
                   "remove it, since its nodes are gone)")
    u.set_defaults(func=run_up)

    d = sub.add_parser("demo", help="download a dataset cold then warm through a local cache")
    d.add_argument("--size", default=None, help="size of the synthetic demo file: bytes or with a suffix, "
                   "e.g. 10MB, 1GiB (default 169001437, the size of cifar-100-python.tar.gz)")
    d.add_argument("--rate", default=None, help="origin throttle in bytes per second, suffixes allowed, "
                   "e.g. 3.5MB (default 3.5 MB/s, what the original experiment measured)")
    d.add_argument("--nodes", type=int, default=1, help="cache nodes (default 1); with 2 or more the warm "
                   "download enters through another node and is a peer hit")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    d.add_argument("--keep", type=Path, default=None, help="keep the cache folder here")
    d.set_defaults(func=run_demo)


def _flags(args: argparse.Namespace, names: list[str]) -> dict:
    return {n: getattr(args, n, None) for n in names}


def run_cache(args: argparse.Namespace) -> int:
    from cachenode.app import read_ca, serve

    settings = load(CacheSettings, config_file=args.config, flags=_flags(
        args, ["listen", "data_dir", "origins", "capacity", "redis_url", "node_id", "advertise",
               "replicas", "tls_listen", "ca_cert", "ca_key", "fill_streams", "max_connections", "request_head_timeout", "log_level"]))
    if settings.redis_url and not settings.cluster_token:
        raise ConfigError("a node that joins a cluster (--redis-url) needs the cluster token its peers share: set "
                          "NEZHA_CLUSTER_TOKEN (or cluster_token in --config); without it any local client could "
                          "drive its internal endpoints")
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
    configure(level=settings.log_level, cache_loggers=True)
    run(serve(settings, ca=ca))
    return 0


def prepare_data_dir(path: Path) -> None:
    """The data folder, made now (after every other setting was checked) or refused naming --data-dir."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--data-dir {str(path)!r}: cannot be created: {e.strerror}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--data-dir {str(path)!r}: not writable by this user")


def run_up(args: argparse.Namespace) -> int:
    import sys

    from nezha.index.connection import redact_url
    from cachenode.local_cluster import LocalCluster, NodeFailed, RingTaken, last_words
    from nezha.config import Origin
    from nezha.errors import RunError

    try:
        origins = [Origin.parse(o) for o in args.origins]
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if args.nodes < 1 or (args.replicas is not None and args.replicas < 1):
        raise ConfigError(f"--nodes ({args.nodes}) and --replicas ({args.replicas}) must be at least 1")
    if args.replicas is not None and args.replicas > args.nodes:
        raise ConfigError(f"--replicas {args.replicas}: cannot exceed --nodes ({args.nodes}); each key is kept on "
                          "that many different nodes")

    async def main() -> None:
        cluster = LocalCluster(nodes=args.nodes, origins=origins, data_dir=args.data_dir,
                               base_port=args.base_port, replicas=args.replicas, redis_url=args.redis_url)
        stop = stop_on_signals()
        watcher = None

        def died(node, epoch) -> None:
            ring = f"taken out of the ring (epoch {epoch})" if epoch is not None else "still in the ring (index down)"
            print(f"nezha up: {node.id} (pid {node.proc.pid}) exited with code {node.proc.returncode}, {ring}: "
                  f"{last_words(cluster.log_of(node))}", file=sys.stderr, flush=True)

        try:
            try:
                await cluster.start(force=args.force)
            except RingTaken as e:
                raise ConfigError(f"--redis-url {redact_url(args.redis_url)}: {e}") from e
            except NodeFailed as e:
                raise RunError(str(e)) from e
            print(f"index {redact_url(cluster.redis_url)}", flush=True)
            print(f"replicas-per-key {cluster.replicas}", flush=True)
            for node in cluster.nodes.values():
                print(f"{node.id} {node.address} pid={node.proc.pid}", flush=True)
            watcher = asyncio.get_running_loop().create_task(cluster.watch(died))
            await stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            await cluster.stop(keep_ring=args.keep_ring)

    asyncio.run(main())
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from cachenode.demo import main as demo_main

    return demo_main(args)
