"""A hand-off from a node of many small objects to a node that joins: its time and what it costs the node's serving.

    python bench/handoff.py [--objects N] [--store DIR] [--keep]

A ring change makes every node copy the objects it holds to their owners
under the new ring. This builds a store of N small objects of 224 bytes
(`bench/small_index.py`'s store, `--store` to reuse one), starts node `a`
on it and an empty node `b` (`nezha cache --workers 1` each, no Redis),
waits until `a`'s index is loaded, then asks `a` to hand off to the ring
{a, b} (`POST /_nezha/handoff`): the objects `b` owns now go to it, in
batches (`POST /_nezha/replicas`); the others stay, and must cost nothing.
Meanwhile hits on `a` are asked at a fixed rate, each timed from when it
was due, as at rest before. Printed last:

    ratios: handoff_s=<seconds> read_ratio=<hand-off seconds / seconds to read the moved objects' files>
        p99_ratio=<a's hit p99 during the hand-off / at rest> max_ms=<slowest hit> rss_mib=<a's RSS peak growth>

`read_ratio`'s reference is the disk alone: one thread opening and reading
each file that moves, after the hand-off (the page cache as warm as the
hand-off left it); the rest of the hand-off's time is the copies' own work
(batches, the receiver's commits).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BenchError, Children, Node, Sampler, run_bench, source_version  # noqa: E402
from bench.small_index import ORIGINS, HOST, build, loaded, p99, path_of, probing, say  # noqa: E402
from nezha.keys import object_id  # noqa: E402
from nezha.ring import Membership  # noqa: E402


async def handoff(node: Node, nodes: dict[str, str], timeout: float = 7200) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.post(node.url + "/_nezha/handoff", json={"nodes": nodes}) as r:
            if r.status != 202:
                raise BenchError(f"handoff: {r.status} {await r.text()}")
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            async with s.get(node.url + "/_nezha/handoff") as r:
                progress = await r.json()
            if progress["state"] == "done":
                return progress
            await asyncio.sleep(0.2)
    raise BenchError(f"the hand-off was not done after {timeout:.0f} s")


def read_files(objects: Path, keys: list[str]) -> float:
    """Seconds to open and read each of these keys' sealed files, one thread (the folders listed first, untimed)."""
    names = {}
    for folder in objects.iterdir():
        if folder.is_dir():
            for name in os.listdir(folder):
                names[name.split(".", 1)[0]] = folder / name
    paths = [names[object_id(key)] for key in keys]
    started = time.monotonic()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            f.read()
    return time.monotonic() - started


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    count = args.objects
    say(f"handoff: {count} objects of 224 bytes, {os.cpu_count()} CPUs, work dir {work}")
    loop = asyncio.get_running_loop()
    if args.store is not None:
        args.store.mkdir(parents=True, exist_ok=True)
        (work / "a").symlink_to(args.store.resolve())
    marker = None if args.store is None else args.store.with_name(args.store.name + ".built")
    if marker is not None and marker.exists():
        say(f"  the store in {args.store} was built before: reused")
    else:
        started = time.monotonic()
        built = await loop.run_in_executor(None, build, work / "a" / "objects", count)
        say(f"  built {built} sealed files in {time.monotonic() - started:.0f} s")
        await loop.run_in_executor(None, os.sync)
        if marker is not None:
            marker.write_text(f"{count}\n")
    a, b = Node(children, work, "a"), Node(children, work, "b")
    await a.start(origins=ORIGINS, args=["--node-id", "a", "--replicas", "1"], timeout=600)
    await b.start(origins=ORIGINS, args=["--node-id", "b", "--replicas", "1"])
    load_s = await loaded(a)
    say(f"  a's index loaded {load_s:.0f} s after start")
    ring = {"a": f"127.0.0.1:{a.port}", "b": f"127.0.0.1:{b.port}"}
    placed = Membership(1, ring).ring()
    moving = [k for k in (f"http://{HOST}{path_of(n)}" for n in range(count)) if placed.owners(k, 1) == ["b"]]
    say(f"  under the ring {{a, b}}, {len(moving)} of {count} objects move to b")

    until = asyncio.Event()
    probe = asyncio.ensure_future(probing(a.url, count, rate=args.rate, until=until))
    await asyncio.sleep(args.window)
    until.set()
    rest = await probe
    assert a.proc is not None
    sampler = Sampler(a.proc.pid, tree=False)
    before = sampler.tree_rss()
    sampler.start()
    until = asyncio.Event()
    probe = asyncio.ensure_future(probing(a.url, count, rate=args.rate, until=until))
    started = time.monotonic()
    progress = await handoff(a, ring)
    handoff_s = time.monotonic() - started
    until.set()
    during = await probe
    sampler.stop()
    grew = (sampler.peak - before) / 2**20
    if progress["failed"] or progress["copied"] + progress["present"] != len(moving):
        raise BenchError(f"hand-off: {progress}, {len(moving)} objects should have moved")
    read_s = await loop.run_in_executor(None, read_files, work / "a" / "objects", moving)
    say(f"  hand-off of {progress['copied']} objects ({progress['bytes']} bytes) in {handoff_s:.1f} s; "
        f"reading their files alone {read_s:.1f} s")
    say(f"  a's hits: at rest p99 {p99(rest):.1f} ms; during the hand-off p99 {p99(during):.1f} ms, "
        f"max {max(during):.0f} ms ({len(during)} hits); a's RSS peak {grew:+.1f} MiB")
    say(f"handoff: code: {source_version()}")
    return (f"ratios: handoff_s={handoff_s:.1f} read_ratio={handoff_s / max(read_s, 1e-3):.1f} "
            f"p99_ratio={p99(during) / p99(rest):.2f} max_ms={max(during):.0f} rss_mib={grew:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=100_000, help="small objects in the store")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--store", type=Path, help="build the store here once and reuse it in later runs")
    ap.add_argument("--rate", type=float, default=100, help="hits a second on the handing node")
    ap.add_argument("--window", type=float, default=10, help="seconds of hits at rest")
    args = ap.parse_args()
    run_bench(lambda work, children: run(args, work, children), prefix="nezha-handoff-", keep=args.keep)


if __name__ == "__main__":
    main()
