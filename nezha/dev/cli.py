"""`nezha up` (a local cluster of node processes) and `nezha demo` (the first thing a user runs).

Registered by the top-level dispatcher (nezha/cli.py) right after `nezha
cache`, so `nezha --help` lists the commands in the order it always has.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from nezha.config import UpSettings
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
    d.add_argument("--size", default=None, help="size of the synthetic demo file: bytes or with a suffix, "
                   "e.g. 10MB, 1GiB (default 169001437, the size of cifar-100-python.tar.gz)")
    d.add_argument("--rate", default=None, help="origin throttle in bytes per second, suffixes allowed, "
                   "e.g. 3.5MB (default 3.5 MB/s, what the original experiment measured)")
    d.add_argument("--nodes", type=int, default=1, help="cache nodes (default 1); with 2 or more the warm "
                   "download enters through another node and is a peer hit")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    d.add_argument("--keep", type=Path, default=None, help="keep the cache folder here")
    d.set_defaults(func=run_demo)

    o = sub.add_parser(
        "origin", help="serve a folder as a slow dataset host, for nezha up",
        description="Serve the files of DIR over HTTP, throttled per connection like a rate-limited internet "
                    "host (the demo's origin), until SIGINT, SIGTERM or SIGHUP. Point nezha up at it: "
                    "nezha up --origin www.cs.toronto.edu=http://127.0.0.1:8000. It prints its URL first.")
    o.add_argument("root", type=Path, metavar="DIR", help="folder whose files it serves (made if missing)")
    o.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000; port 0: any "
                   "free one)")
    o.add_argument("--rate", default=None, help="bytes per second per connection, suffixes allowed, e.g. 3.5MB; "
                   "0: unthrottled (default 3.5 MB/s, as the demo)")
    o.add_argument("--ranges", action="store_true", help="answer Range requests when throttled too, as S3 does "
                   "(default: one stream per download, like the demo's host)")
    o.add_argument("--demo-file", metavar="SIZE", default=None, help="first write the demo's synthetic file of "
                   "SIZE bytes (e.g. 50MB) as DIR/~kriz/cifar-100-python.tar.gz, the same bytes as nezha demo "
                   "--size SIZE serves")
    o.set_defaults(func=run_origin)


def run_up(args: argparse.Namespace) -> int:
    import sys

    from nezha.config import load
    from nezha.dev.local_cluster import LocalCluster, NodeFailed, RingTaken, last_words
    from nezha.errors import RunError
    from nezha.index.connection import redact_url
    from nezha.logs import configure

    settings = load(UpSettings, config_file=args.config, flags=given(args))
    # Its own lines on stderr: stdout is what it reports (nodes, index, the stats command).
    configure(level=settings.log_level if "log_level" in settings.model_fields_set else "warning",
              json=True, stream=sys.stderr)

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
    from nezha.dev.demo import main as demo_main

    return demo_main(args)


def run_origin(args: argparse.Namespace) -> int:
    from nezha.config import parse_hostport, parse_size
    from nezha.dev.demo import PATH, RATE_2018, make_dataset
    from nezha.dev.origin import LocalOrigin
    from nezha.errors import RunError

    root: Path = args.root
    if root.exists() and not root.is_dir():
        raise ConfigError(f"DIR {str(root)!r}: exists and is not a folder")
    try:
        host, port = parse_hostport(args.listen, field="--listen")
    except ValueError as e:
        raise ConfigError(f"--listen {args.listen!r}: {e}") from e
    values = {}
    for flag, given in (("--rate", args.rate), ("--demo-file", args.demo_file)):
        try:
            values[flag] = None if given is None else parse_size(given)
        except ValueError as e:
            raise ConfigError(f"{flag} {given!r}: {e}") from e
    rate = RATE_2018 if values["--rate"] is None else values["--rate"]
    if values["--demo-file"] is not None and values["--demo-file"] <= 0:
        raise ConfigError(f"--demo-file {args.demo_file!r}: must be positive")
    try:
        root.mkdir(parents=True, exist_ok=True)
        if values["--demo-file"] is not None:
            make_dataset(root / PATH.lstrip("/"), values["--demo-file"])
    except OSError as e:
        raise RunError(f"cannot write to {root}: {e.strerror or e}") from e

    async def main() -> None:
        origin = LocalOrigin(root, rate=rate or None, ranges=args.ranges)
        stop = stop_on_signals(hangup=True)
        try:
            url = await origin.start(host, port)
        except OSError as e:
            raise RunError(f"cannot listen on {args.listen} (--listen): {e.strerror or e}") from e
        throttle = f"{rate / 1e6:.2f} MB/s per connection" if rate else "unthrottled"
        print(f"origin {url} serving {root.resolve()} {throttle}", flush=True)
        try:
            await stop.wait()
        finally:
            await origin.stop()

    asyncio.run(main())
    return 0
