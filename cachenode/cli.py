"""`nezha cache` (one node) and `nezha demo` (the first thing a user runs)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from nezha.config import CacheSettings, load
from nezha.lifecycle import stop_on_signals
from nezha.logs import configure


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="run one cache node")
    p.add_argument("--listen", help="HOST:PORT to serve on (default 127.0.0.1:8080)")
    p.add_argument("--data-dir", type=Path, help="folder for cached objects")
    p.add_argument("--origin", action="append", dest="origins", metavar="HOST=UPSTREAM_URL",
                   help="a dataset host and where to fetch it; repeat for more")
    p.add_argument("--capacity", help="bytes of disk to use, e.g. 50GiB; LRU eviction beyond")
    p.add_argument("--redis-url", help="index to join (redis:// or rediss://)")
    p.add_argument("--node-id", help="this node's identity in the ring")
    p.add_argument("--advertise", help="HOST:PORT peers use to reach this node")
    p.add_argument("--replicas", type=int, help="owners per key (replicas-per-key); default 2 with --redis-url, "
                   "else 1")
    p.add_argument("--config", type=Path, help="YAML file of settings")
    p.add_argument("--log-level")
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
    u.add_argument("--base-port", type=int, default=8080, help="node i listens on 127.0.0.1:BASE+i")
    u.add_argument("--data-dir", type=Path, default=Path("./nezha-data"), help="node i uses DIR/node-i")
    u.add_argument("--replicas", type=int, default=None,
                   help="owners per key (default min(2, NODES): any one node can stop without losing an object)")
    u.add_argument("--redis-url", help="index to use; default: an embedded one")
    u.set_defaults(func=run_up)

    d = sub.add_parser("demo", help="download a dataset cold then warm through a local cache")
    d.add_argument("--size", type=int, default=None, help="bytes of the demo file (default 169001437)")
    d.add_argument("--rate", type=float, default=None, help="origin throttle in bytes/s (default 3.5 MB/s)")
    d.add_argument("--nodes", type=int, default=1, help="cache nodes; with 2 or more the warm download "
                   "enters through another node and is a peer hit")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    d.add_argument("--keep", type=Path, default=None, help="keep the cache folder here")
    d.set_defaults(func=run_demo)


def _flags(args: argparse.Namespace, names: list[str]) -> dict:
    return {n: getattr(args, n, None) for n in names}


def run_cache(args: argparse.Namespace) -> int:
    from cachenode.app import serve

    settings = load(CacheSettings, config_file=args.config, flags=_flags(
        args, ["listen", "data_dir", "origins", "capacity", "redis_url", "node_id", "advertise",
               "replicas", "log_level"]))
    configure(level=settings.log_level, cache_loggers=True)
    asyncio.run(serve(settings))
    return 0


def run_up(args: argparse.Namespace) -> int:
    from cachenode.local_cluster import LocalCluster
    from nezha.config import Origin
    from nezha.errors import ConfigError

    try:
        origins = [Origin.parse(o) for o in args.origins]
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if args.nodes < 1 or (args.replicas is not None and args.replicas < 1):
        raise ConfigError(f"--nodes ({args.nodes}) and --replicas ({args.replicas}) must be at least 1")

    async def main() -> None:
        cluster = LocalCluster(nodes=args.nodes, origins=origins, data_dir=args.data_dir,
                               base_port=args.base_port, replicas=args.replicas, redis_url=args.redis_url)
        stop = stop_on_signals()
        try:
            await cluster.start()
            print(f"index {cluster.redis_url}", flush=True)
            print(f"replicas-per-key {cluster.replicas}", flush=True)
            for node in cluster.nodes.values():
                print(f"{node.id} {node.address} pid={node.proc.pid}", flush=True)
            await stop.wait()
        finally:
            await cluster.stop()

    asyncio.run(main())
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from cachenode.demo import main as demo_main

    return demo_main(args)
