"""`nezha ring set|show` and `nezha stats`: an operator's view of the shared index.

Everything printed comes from Redis (through `nezha.index`), never from a
node, so these commands work while nodes are down and show what the nodes
themselves will read. Result on stdout, problems on stderr; exit 1 when the
index cannot be reached, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import sys

from nezha.config import ClusterSettings, load
from nezha.config.flags import add_settings, given
from nezha.errors import ConfigError
from nezha.logs import configure


def register(sub: argparse._SubParsersAction) -> None:
    ring = sub.add_parser("ring", help="read or write ring membership in the index")
    actions = ring.add_subparsers(dest="ring_command", metavar="ACTION")
    actions.required = True

    s = actions.add_parser("set", help="replace the ring membership (bumps the epoch; nodes follow within a second)")
    s.add_argument("nodes", nargs="+", metavar="ID=HOST:PORT", help="every member of the new ring")
    s.add_argument("--weight", action="append", default=[], metavar="ID=W",
                   help="share of keys relative to weight 1 (default); repeat per node")
    s.add_argument("--json", action="store_true", help="print the new membership as JSON")
    _common(s)
    s.set_defaults(func=run_ring_set)

    show = actions.add_parser("show", help="print the ring membership and its epoch")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    _common(show)
    show.set_defaults(func=run_ring_show)

    st = sub.add_parser("stats", help="hits, misses and bytes per node, per origin host and for the cluster")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    _common(st)
    st.set_defaults(func=run_stats)


def _common(p: argparse.ArgumentParser) -> None:
    add_settings(p, ClusterSettings, command=p.prog)


def _settings(args: argparse.Namespace) -> ClusterSettings:
    settings = load(ClusterSettings, config_file=args.config, flags=given(args))
    # Logs share stdout with the result; only ask for them when asked.
    configure(level=settings.quiet_log_level())
    if settings.redis_url is None:
        raise ConfigError("no index to talk to: pass --redis-url URL or set NEZHA_REDIS_URL")
    return settings


def _run(args: argparse.Namespace, work) -> int:
    from nezha.index.handle import Index
    from nezha.index.connection import IndexUnavailable

    settings = _settings(args)

    async def main() -> int:
        index = Index(redis_url=settings.redis_url, node_id=None)
        try:
            return await work(index)
        finally:
            await index.close(flush_timeout=0.5)

    try:
        return asyncio.run(main())
    except IndexUnavailable as e:
        label = f"ring {args.ring_command}" if args.command == "ring" else args.command
        print(f"nezha {label}: {e}", file=sys.stderr)
        return 1


def _pairs(specs: list[str], *, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{what} wants ID=VALUE, got {spec!r}")
        if key in out:
            raise ConfigError(f"{what}: node {key!r} is given twice")
        out[key] = value
    return out


def run_ring_set(args: argparse.Namespace) -> int:
    nodes = _pairs(args.nodes, what="ring set")
    weights: dict[str, int] = {}
    for node, w in _pairs(args.weight, what="--weight").items():
        if not w.isdigit():
            raise ConfigError(f"--weight {node}={w}: weight must be a positive integer")
        weights[node] = int(w)
    from nezha.index.membership import check_membership

    nodes, weights = check_membership(nodes, weights)  # refuse bad input before touching Redis

    async def work(index) -> int:
        await index.set_membership(nodes, weights)
        _print_membership(await index.get_membership() or index.membership, as_json=args.json)
        return 0

    return _run(args, work)


def run_ring_show(args: argparse.Namespace) -> int:
    async def work(index) -> int:
        membership = await index.get_membership()
        if membership is None:
            if args.json:
                print(json.dumps({"epoch": None, "nodes": {}, "weights": {}}))
            else:
                print("no ring membership in the index yet (write one with `nezha ring set ID=HOST:PORT ...`)")
            return 0
        _print_membership(membership, as_json=args.json)
        return 0

    return _run(args, work)


def _print_membership(membership, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"epoch": membership.epoch, "nodes": membership.nodes, "weights": membership.weights},
                         sort_keys=True))
        return
    total = sum(membership.weights.values()) or 1
    rows = [["NODE", "ADDRESS", "WEIGHT", "SHARE"]]
    for node in sorted(membership.nodes):
        w = membership.weights.get(node, 1)
        rows.append([node, membership.nodes[node], str(w), f"{100 * w / total:.1f}%"])
    print(f"epoch {membership.epoch}, {len(membership.nodes)} node(s)")
    if len(rows) > 1:
        print(_table(rows))


def run_stats(args: argparse.Namespace) -> int:
    from nezha.index.schema import hit_ratio

    async def work(index) -> int:
        stats = await index.read_stats()
        now = time.time()
        for group in (stats["nodes"], stats["hosts"]):
            for values in group.values():
                values["hit_ratio"] = hit_ratio(values)
        for values in stats["nodes"].values():
            # A node rewrites updated_at at every flush (about each second) while it runs and
            # reaches Redis: an old one means it stopped or is cut off.
            at = values.get("updated_at")
            values["age_seconds"] = None if at is None else round(max(0.0, now - float(at)), 1)
            values["stale"] = at is None or now - float(at) > STALE_AFTER
        stats["cluster"]["hit_ratio"] = hit_ratio(stats["cluster"])
        stats["pinned"] = await index.read_pins()
        if args.json:
            print(json.dumps(stats, sort_keys=True))
        else:
            print(_stats_table(stats))
        return 0

    return _run(args, work)


# A node that has not reported for this long is marked STALE: it flushes about every second.
STALE_AFTER = 10.0

_COLUMNS = [("HITS", "hits", str), ("PEER", "peer_hits", str), ("MISSES", "misses", str),
            ("HIT%", "hit_ratio", None), ("SERVED", "bytes_served", "bytes"),
            ("FROM ORIGIN", "bytes_from_origin", "bytes"), ("OBJECTS", "objects", str),
            ("STORED", "bytes_stored", "bytes"), ("EVICTED", "evictions", str), ("FAILED", "failed_fills", str)]


def _stats_table(stats: dict) -> str:
    rows = [["SCOPE", "NAME", "REPORTED"] + [c[0] for c in _COLUMNS]]

    def row(scope: str, name: str, values: dict) -> None:
        cells = [scope, name, _reported(values) if scope == "node" else "-"]
        for _, field, kind in _COLUMNS:
            value = values.get(field)
            if field == "hit_ratio":
                cells.append("-" if value is None else f"{100 * value:.1f}%")
            elif kind == "bytes":
                cells.append(human_bytes(value or 0))
            else:
                cells.append(str(value or 0))
        rows.append(cells)

    row("cluster", "-", stats["cluster"])
    for node in sorted(stats["nodes"]):
        row("node", node, stats["nodes"][node])
    for host in sorted(stats["hosts"]):
        row("host", host, stats["hosts"][host])
    out = _table(rows)
    pinned = stats.get("pinned") or {}
    if pinned:
        # Kept from eviction for the workloads that prefetched it (docs/controller.md, "Kept while used").
        kept = [["WORKLOAD", "PINNED", "UNTIL"]] + [
            [w, human_bytes(r["bytes"]), "while it exists" if r["until"] is None else
             time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["until"]))] for w, r in sorted(pinned.items())]
        out += "\n\n" + _table(kept)
    return out


def _reported(values: dict) -> str:
    """How long ago the node last reported, and STALE past STALE_AFTER."""
    age = values.get("age_seconds")
    if age is None:
        return "never STALE"
    shown = f"{age:.0f}s ago" if age < 120 else f"{age / 60:.0f}m ago" if age < 7200 else f"{age / 3600:.0f}h ago"
    return f"{shown} STALE" if values.get("stale") else shown


def human_bytes(n: int) -> str:
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
