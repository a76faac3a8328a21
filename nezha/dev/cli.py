"""`nezha up` (a local cluster of node processes) and `nezha demo` (the first thing a user runs).

Registered by the top-level dispatcher (nezha/cli.py) right after `nezha
cache`, so `nezha --help` lists the commands in the order it always has.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from nezha.errors import ConfigError
from nezha.lifecycle import stop_on_signals


def register(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser(
        "up", help="run a local cache cluster of node processes",
        description="Start NODES cache node processes on this machine, publish their ring in the index and "
                    "serve until SIGINT, SIGTERM or SIGHUP, which stops every node and the index it started; its nodes and index also end when it is killed outright. The set of nodes is fixed while it "
                    "runs: nezha up never adds or removes a node, so it never needs to drain one. Cached objects stay "
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


def run_up(args: argparse.Namespace) -> int:
    import sys

    from nezha.index.connection import redact_url
    from nezha.config import Origin
    from nezha.dev.local_cluster import LocalCluster, NodeFailed, RingTaken, last_words
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
        stop = stop_on_signals(hangup=True)
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
    from nezha.dev.demo import main as demo_main

    return demo_main(args)
