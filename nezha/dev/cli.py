"""`nezha up` (a local cluster of node processes) and `nezha demo` (the first thing a user runs).

Registered by the top-level dispatcher (nezha/cli.py) right after `nezha
cache`, so `nezha --help` lists the commands in the order it always has.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from nezha.config import DemoSettings, LocalOriginSettings, UpSettings
from nezha.config.flags import add_settings, given
from nezha.errors import ConfigError
from nezha.lifecycle import stop_on_signals


def register(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser(
        "up", help="run a local cache cluster of node processes",
        description="Start NODES cache node processes on this machine, publish their ring in the index and "
                    "serve until SIGINT, SIGTERM or SIGHUP, which stops every node and the index it started; "
                    "its nodes and index also end when it is killed outright. The set of nodes is fixed while "
                    "it runs: nezha up never adds or removes a node, so it never needs to drain one. Cached "
                    "objects stay in DIR/node-i for the next run, node i logs to DIR/node-i.log. Every node "
                    "setting of nezha cache is also one of nezha up (a NEZHA_* variable or a --config key) "
                    "and goes to every node, except each node's address and name, which nezha up sets.")
    add_settings(u, UpSettings, command="up")
    u.set_defaults(func=run_up)

    d = sub.add_parser("demo", help="download a dataset cold then warm through a local cache")
    add_settings(d, DemoSettings, command="demo")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    d.set_defaults(func=run_demo)

    o = sub.add_parser(
        "origin", help="serve a folder as a slow dataset host, for nezha up",
        description="Serve the files of DIR over HTTP, throttled per connection like a rate-limited internet "
                    "host (the demo's origin), until SIGINT, SIGTERM or SIGHUP. Point nezha up at it: "
                    "nezha up --origin www.cs.toronto.edu=http://127.0.0.1:8000. It prints its URL first.")
    o.add_argument("root", type=Path, metavar="DIR", help="folder whose files it serves (made if missing)")
    add_settings(o, LocalOriginSettings, command="origin")
    o.set_defaults(func=run_origin)


def run_up(args: argparse.Namespace) -> int:
    from nezha.config import load
    from nezha.dev.local_cluster import LocalCluster, NodeFailed, RingTaken, last_words
    from nezha.errors import RunError
    from nezha.index.connection import redact_url
    from nezha.logs import configure

    settings = load(UpSettings, config_file=args.config, flags=given(args))
    # Its own lines on stderr: stdout is what it reports (nodes, index, the stats command).
    configure(level=settings.quiet_log_level(), json=True, stream=sys.stderr)

    async def main() -> None:
        cluster = LocalCluster(nodes=settings.nodes, origins=settings.origins, data_dir=settings.data_dir,
                               base_port=settings.base_port, replicas=settings.replicas,
                               redis_url=settings.redis_url, log_level=settings.log_level,
                               node_settings=settings.node_settings(), tls_base_port=settings.tls_base_port,
                               token=settings.cluster_token)
        stop = stop_on_signals(hangup=True)
        watcher = None

        def died(node, epoch) -> None:
            ring = f"taken out of the ring (epoch {epoch})" if epoch is not None else "still in the ring (index down)"
            print(f"nezha up: {node.id} (pid {node.proc.pid}) exited with code {node.proc.returncode}, {ring}: "
                  f"{last_words(cluster.log_of(node))}", file=sys.stderr, flush=True)

        try:
            try:
                await cluster.start(force=settings.force)
            except RingTaken as e:
                raise ConfigError(f"--redis-url {redact_url(settings.redis_url)}: {e}") from e
            except NodeFailed as e:
                raise RunError(str(e)) from e
            index = redact_url(cluster.redis_url)
            print(f"index {index}", flush=True)
            print(f"replicas-per-key {cluster.replicas}", flush=True)
            for node in cluster.nodes.values():
                tls = f" tls={node.tls_address}" if node.tls_address else ""
                print(f"{node.id} {node.address} pid={node.proc.pid}{tls}", flush=True)
            print(f"logs: {settings.data_dir / 'node-<i>.log'}", flush=True)
            print(f"stats: nezha stats --redis-url {index}", flush=True)
            watcher = asyncio.get_running_loop().create_task(cluster.watch(died))
            await stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            await cluster.stop(keep_ring=settings.keep_ring)

    asyncio.run(main())
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from nezha.config import load
    from nezha.dev.demo import main as demo_main

    settings = load(DemoSettings, config_file=args.config, flags=given(args))
    return demo_main(settings, as_json=args.json)


def run_origin(args: argparse.Namespace) -> int:
    from nezha.config import load
    from nezha.dev.demo import PATH, make_dataset
    from nezha.dev.origin import LocalOrigin
    from nezha.errors import RunError
    from nezha.logs import configure

    root: Path = args.root
    if root.exists() and not root.is_dir():
        raise ConfigError(f"DIR {str(root)!r}: exists and is not a folder")
    settings = load(LocalOriginSettings, config_file=args.config, flags=given(args))
    host, port = settings.listen_addr
    rate = settings.rate
    configure(level=settings.quiet_log_level(), stream=sys.stderr)
    try:
        root.mkdir(parents=True, exist_ok=True)
        if settings.demo_file is not None:
            make_dataset(root / PATH.lstrip("/"), settings.demo_file)
    except OSError as e:
        raise RunError(f"cannot write to {root}: {e.strerror or e}") from e

    async def main() -> None:
        origin = LocalOrigin(root, rate=rate or None, ranges=settings.ranges)
        stop = stop_on_signals(hangup=True)
        try:
            url = await origin.start(host, port)
        except OSError as e:
            raise RunError(f"cannot listen on {settings.listen} (--listen): {e.strerror or e}") from e
        throttle = f"{rate / 1e6:.2f} MB/s per connection" if rate else "unthrottled"
        print(f"origin {url} serving {root.resolve()} {throttle}", flush=True)
        try:
            await stop.wait()
        finally:
            await origin.stop()

    asyncio.run(main())
    return 0
