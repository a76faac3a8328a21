"""A million small objects on one node: memory per object, restart to the first hit, a worker's join.

    python bench/small_index.py [--objects N] [--keep] [--store DIR] [--join]

An ImageNet-shaped dataset is a million files or more; a node that holds
them must fit them in memory and come back at once after a restart. This
builds a store of N small objects (default 1,000,000; 224 bytes each, one
sealed file per object) with the store's own writer
(cachenode/store/layout.py `place_small`), then runs `nezha cache`
(`--workers 1`) on it as its own process:

- restart_ms: the node started on the folder of N objects (as after a
  restart: nothing of them is in its memory), spawn to its first hit;
  each probe asks another object, so a miss is not a hit of the next try;
- bytes_per_object: the node's RSS once its index is loaded
  (`/readyz` store_loaded = 1.0), less the RSS of the same node started
  on an empty folder, divided by N;
- a thousand objects, spread over the store, are then read through the
  node and compared with what was written (every one a hit).

Printed as the last line:

    ratios: bytes_per_object=<RSS growth / objects> restart_ms=<spawn to first hit> load_s=<index loaded>

Targets (docs/benchmarks.md): bytes_per_object <= 300, restart_ms < 1,000, at 1 M objects.

`--join` measures instead what a follower worker joining the node costs
its primary: the node runs `--workers 2` on the store; once its index is
loaded and both workers listen, hits that only the primary serves (a
header the fast path does not take sends them to the primary's handler)
are asked at a fixed rate, each timed from when it was due (so a stalled
loop shows in every request it held back), for `--window` seconds at rest,
then from a SIGKILL of the follower until the supervisor's new follower
listens again (it joins meanwhile) and a second more. Printed last:

    ratios: join_p99_ratio=<p99 during the join / p99 at rest> join_max_ms=<slowest> join_s=<kill to listening>
        primary_rss_mib=<the primary's RSS peak during the join less before it>

`--store DIR` builds the store there once and reuses it in later runs (a
million objects take minutes to write), e.g. for the same store measured
with another checkout's code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BenchError, Children, Node, Sampler, run_bench, source_version  # noqa: E402
from cachenode.store.layout import place_small  # noqa: E402
from cachenode.store.objects import Meta  # noqa: E402
from nezha.wire import CACHE_HEADER  # noqa: E402

HOST = "images.bench"
ORIGINS = {HOST: "http://127.0.0.1:9"}  # never asked: every object read is stored; a miss would be a 502


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def path_of(n: int) -> str:
    return f"/train/{n:07d}.JPEG"


def body_of(n: int) -> bytes:
    return f"{n:07d}".encode() * 32


def build(objects: Path, count: int) -> int:
    """`count` small objects written as a node's commits leave them (without sync)."""
    now = time.time()
    headers = (("Content-Type", "image/jpeg"),)

    def items():
        for n in range(count):
            key = f"http://{HOST}{path_of(n)}"
            yield (Meta(key=key, url=key, host=HOST, size=0, headers=headers, stored_at=now,
                        expires_at=now + 30 * 86400), body_of(n))

    return place_small(objects, items())


async def get(session: aiohttp.ClientSession, url: str, path: str) -> tuple[int, str | None, bytes]:
    async with session.get(url + path, headers={"Host": HOST}) as r:
        return r.status, r.headers.get(CACHE_HEADER), await r.read()


async def start_to_first_hit(node: Node, count: int) -> float:
    """Spawn `node` and ask stored objects until one is a hit; ms from spawn to that hit."""
    started = time.monotonic()
    spawn = asyncio.create_task(node.start(origins=ORIGINS, timeout=600))
    probes = iter(range(count - 1, -1, -7919))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        n = next(probes)
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                status, outcome, body = await get(s, node.url, path_of(n))
                if status == 200 and outcome == "hit":
                    took = time.monotonic() - started
                    if body != body_of(n):
                        raise BenchError(f"the node served {path_of(n)} with other bytes than were stored")
                    break
                n = next(probes)
            if spawn.done():
                spawn.result()
            await asyncio.sleep(0.002)
    await spawn
    return took * 1000


async def loaded(node: Node, timeout: float = 3600) -> float:
    """Wait until the node's index holds every stored object; seconds waited."""
    started = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - started < timeout:
            async with s.get(node.url + "/readyz") as r:
                if (await r.json()).get("store_loaded") == 1.0:
                    return time.monotonic() - started
            await asyncio.sleep(0.5)
    raise BenchError(f"the index was not loaded after {timeout:.0f} s")


async def probing(url: str, count: int, *, rate: float, until: asyncio.Event) -> list[float]:
    """Hits the primary serves, `rate` a second until `until` is set; ms each took from when it was due."""
    loop = asyncio.get_running_loop()
    took: list[float] = []
    tasks = set()
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as s:
        async def one(due: float, n: int) -> None:
            async with s.get(url + path_of(n), headers={"Host": HOST, "X-Bench": "primary"}) as r:
                body = await r.read()
            if r.status != 200 or r.headers.get(CACHE_HEADER) != "hit" or body != body_of(n):
                raise BenchError(f"{path_of(n)}: {r.status} {r.headers.get(CACHE_HEADER)}: not the stored object")
            took.append((loop.time() - due) * 1000)

        due, i = loop.time(), 0
        while not until.is_set():
            task = asyncio.ensure_future(one(due, (i * 7919) % count))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            due += 1 / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
        await asyncio.gather(*tasks)
    return took


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else max(values, default=0.0)


def worker_of(node: Node, role: str) -> int:
    """The pid of the node's worker of `role` ("primary", "follower")."""
    import psutil

    assert node.proc is not None
    for child in psutil.Process(node.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            if child.environ().get("NEZHA_WORKER_ROLE") == role:
                return child.pid
    raise BenchError(f"no {role} worker found under the node's supervisor")


async def window(url: str, count: int, rate: float, seconds: float | None, done=None) -> list[float]:
    """Probe for `seconds`, or until `done()` (awaited) returns, then one second more."""
    until = asyncio.Event()
    probe = asyncio.ensure_future(probing(url, count, rate=rate, until=until))
    if done is not None:
        await done()
        await asyncio.sleep(1)
    else:
        await asyncio.sleep(seconds)
    until.set()
    return await probe


async def join(args: argparse.Namespace, work: Path, children: Children, count: int) -> str:
    node = Node(children, work, "node")
    await node.start(origins=ORIGINS, args=["--workers", "2"], timeout=600)
    load_s = await loaded(node)
    await node.serving_workers(2, timeout=3600)
    say(f"  --workers 2: index loaded {load_s:.0f} s after start, both workers listen")
    rest = await window(node.url, count, args.rate, args.window)
    say(f"  at rest: {len(rest)} primary hits, p99 {p99(rest):.1f} ms, max {max(rest):.1f} ms")
    primary = Sampler(worker_of(node, "primary"), tree=False)
    before = primary.tree_rss()
    primary.start()
    os.kill(worker_of(node, "follower"), signal.SIGKILL)
    killed = time.monotonic()
    joined = {}

    async def listening() -> None:
        await asyncio.sleep(0.5)  # the dead follower's socket is gone; the new one is not there yet
        await node.serving_workers(2, timeout=3600)
        joined["s"] = time.monotonic() - killed

    during = await window(node.url, count, args.rate, None, done=listening)
    primary.stop()
    join_s = joined["s"]
    grew = (primary.peak - before) / 2**20
    say(f"  a follower killed and joined again in {join_s:.1f} s: {len(during)} primary hits meanwhile, "
        f"p99 {p99(during):.1f} ms, max {max(during):.1f} ms; the primary's RSS peak {grew:+.1f} MiB")
    say(f"small_index --join: code: {source_version()}")
    return (f"ratios: join_p99_ratio={p99(during) / p99(rest):.2f} join_max_ms={max(during):.0f} "
            f"join_s={join_s:.1f} primary_rss_mib={grew:.1f}")


async def build_once(work: Path, count: int, store: Path | None) -> None:
    """The node's data folder at work/node, holding `count` small objects: built now, or `store`'s, built by
    an earlier run (a million objects take minutes to write)."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    if store is not None:  # one store for several runs: the node's data folder is a link to it
        store.mkdir(parents=True, exist_ok=True)
        (work / "node").symlink_to(store.resolve())
    objects = work / "node" / "objects"
    marker = None if store is None else store.with_name(store.name + ".built")
    if marker is not None and marker.exists():
        say(f"  the store in {store} was built before: reused")
        return
    built = await loop.run_in_executor(None, build, objects, count)
    say(f"  built {built} sealed files in {time.monotonic() - started:.0f} s")
    await loop.run_in_executor(None, os.sync)
    if marker is not None:
        marker.write_text(f"{count}\n")


@dataclass
class Measured:
    bytes_per_object: float
    restart_ms: float
    load_s: float


async def measure(work: Path, children: Children, count: int, store: Path | None = None) -> Measured:
    """Build a store of `count` small objects (or reuse `store`'s), start a node on it, and measure; every
    thousandth object is then read back through the node, a hit and exact. bench/small_files.py reports
    its bytes_per_object and restart_ms from here."""
    await build_once(work, count, store)
    empty = Node(children, work, "empty")
    await empty.start(origins=ORIGINS)
    assert empty.proc is not None
    await asyncio.sleep(1)
    rss0 = Sampler(empty.proc.pid, tree=False).tree_rss()
    await children.stop(empty.proc)

    node = Node(children, work, "node")
    restart_ms = await start_to_first_hit(node, count)
    say(f"  start to first hit: {restart_ms:.0f} ms with {count} objects on disk")
    load_s = await loaded(node)
    say(f"  index loaded {load_s:.0f} s after the first hit")
    assert node.proc is not None
    await asyncio.sleep(1)
    rss1 = Sampler(node.proc.pid, tree=False).tree_rss()
    bytes_per_object = (rss1 - rss0) / count
    say(f"  node RSS {rss0 / 2**20:.1f} MiB empty -> {rss1 / 2**20:.1f} MiB loaded: "
        f"{bytes_per_object:.0f} bytes per object")

    async with aiohttp.ClientSession() as s:
        for n in range(0, count, max(1, count // 1000)):
            status, outcome, body = await get(s, node.url, path_of(n))
            if status != 200 or outcome != "hit" or body != body_of(n):
                raise BenchError(f"{path_of(n)}: {status} {outcome}, {len(body)} bytes: not the stored object")
    say("  a thousand objects read back: every one a hit, exact")
    await children.stop(node.proc)
    return Measured(bytes_per_object, restart_ms, load_s)


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    count = args.objects
    say(f"small index: {count} objects of 224 bytes, {os.cpu_count()} CPUs, work dir {work}")
    started = time.monotonic()
    if args.join:
        await build_once(work, count, args.store)
        return await join(args, work, children, count)
    m = await measure(work, children, count, args.store)
    say(f"small_index: {time.monotonic() - started:.0f} s; code: {source_version()}")
    say(f"  bytes_per_object  node RSS / object    {m.bytes_per_object:6.0f}  target <= 300 (at 1 M objects)")
    say(f"  restart_ms        start to first hit   {m.restart_ms:6.0f}  target < 1000 (at 1 M objects)")
    return f"ratios: bytes_per_object={m.bytes_per_object:.0f} restart_ms={m.restart_ms:.0f} load_s={m.load_s:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=1_000_000, help="small objects in the store")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--store", type=Path, help="build the store here once and reuse it in later runs")
    ap.add_argument("--join", action="store_true", help="measure a follower worker's join instead")
    ap.add_argument("--rate", type=float, default=200, help="--join: primary hits a second")
    ap.add_argument("--window", type=float, default=10, help="--join: seconds of hits at rest")
    args = ap.parse_args()
    run_bench(lambda work, children: run(args, work, children), prefix="nezha-index-", keep=args.keep)


if __name__ == "__main__":
    main()
