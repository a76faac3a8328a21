"""A million small objects on one node: memory per object and restart to the first hit.

    python bench/small_index.py [--objects N] [--keep]

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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
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


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    count = args.objects
    say(f"small index: {count} objects of 224 bytes, {os.cpu_count()} CPUs, work dir {work}")
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    built = await loop.run_in_executor(None, build, work / "node" / "objects", count)
    say(f"  built {built} sealed files in {time.monotonic() - started:.0f} s")
    await loop.run_in_executor(None, os.sync)

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

    say(f"small_index: {time.monotonic() - started:.0f} s; code: {source_version()}")
    say(f"  bytes_per_object  node RSS / object    {bytes_per_object:6.0f}  target <= 300 (at 1 M objects)")
    say(f"  restart_ms        start to first hit   {restart_ms:6.0f}  target < 1000 (at 1 M objects)")
    return f"ratios: bytes_per_object={bytes_per_object:.0f} restart_ms={restart_ms:.0f} load_s={load_s:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=1_000_000, help="small objects in the store")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    run_bench(lambda work, children: run(args, work, children), prefix="nezha-index-", keep=args.keep)


if __name__ == "__main__":
    main()
