#!/usr/bin/env python3
"""What a cold small fill's origin exchange costs the node's process: the
origin client through aiohttp (fill/origin.py `OriginClient.request`, the
body read, the response released) against the node's own small-answer
client (fill/small_gets.py `SmallGets.get`), on the same origin, in the
same process, in the same minutes.

One nginx origin on loopback serves `--objects` files of 16 KiB; each
round asks every file once (`--in-flight` at a time, as 64 client
connections keep about that many fills waiting on the origin) through one
client, then through the other, the order reversed every other round. A
run's cost is this process's CPU time (user + system, `time.process_time`,
which counts the event loop's work and the system calls, not nginx's) over
the GETs it made; both clients send the same request bytes (the node's
forwarded fields: Via) and the script stops if an answer's body is not the
file's. Reported: microseconds of CPU per GET for each client per round,
the minimum of each over the rounds, and how many rounds favoured SmallGets.

    python bench/small_get_cost.py [--objects 4000] [--rounds 6] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from aiohttp import ClientTimeout  # noqa: E402
from multidict import CIMultiDict, CIMultiDictProxy  # noqa: E402

from bench.harness import KiB, Children, Nginx, StaticFiles, nginx_conf, run_bench  # noqa: E402
from bench.small_files import make_dataset, path_of, say  # noqa: E402
from cachenode.fill.origin import OriginClient  # noqa: E402
from cachenode.fill.plain_get import plain_request  # noqa: E402
from cachenode.fill.small_gets import SmallGets  # noqa: E402

FORWARDED = CIMultiDict([("Via", "1.1 bench-node")])
FORWARDED_PROXY = CIMultiDictProxy(FORWARDED)  # a miss's forwarded fields, as front/fast_misses.py holds them
NO_TOTAL = ClientTimeout(total=None)


async def through_aiohttp(client: OriginClient, urls: list[str], in_flight: int, sizes: int) -> None:
    queue = iter(urls)

    async def worker() -> None:
        for url in queue:
            response = await client.request("GET", url, headers=FORWARDED, what="origin")
            body = await response.read()
            response.release()
            if len(body) != sizes:
                raise SystemExit(f"aiohttp: {url} gave {len(body)} bytes")

    await asyncio.gather(*(worker() for _ in range(in_flight)))


async def through_small_gets(gets: SmallGets, urls: list[str], in_flight: int, sizes: int) -> None:
    queue = iter(urls)

    async def worker() -> None:
        for url in queue:
            # As the node's fast misses ask (front/fast_misses.py `FastMisses._small_get`).
            asked = plain_request(url, FORWARDED_PROXY, NO_TOTAL)
            assert asked is not None
            host, port, head = asked
            answer = await gets.get(host, port, head, small_max=1 << 20, timeout=30, url=url)
            if answer is None or len(answer.body) != sizes:
                raise SystemExit(f"small gets: {url} not answered whole")

    await asyncio.gather(*(worker() for _ in range(in_flight)))


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    root = work / "origin-files"
    await asyncio.get_running_loop().run_in_executor(None, make_dataset, root, args.objects, 16 * KiB)
    origin = Nginx(children, work, "origin")
    await origin.start(nginx_conf(StaticFiles(root=root), by="bench/small_get_cost.py", worker_connections=4096,
                                  nofile=65536))
    urls = [origin.url + path_of(n) for n in range(args.objects)]
    client = OriginClient(connect_timeout=5, read_timeout=30)
    await client.start()
    gets = SmallGets()
    ways = {"aiohttp": lambda: through_aiohttp(client, urls, args.in_flight, 16 * KiB),
            "small_gets": lambda: through_small_gets(gets, urls, args.in_flight, 16 * KiB)}
    results: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for name, way in ways.items():
            await way()  # warm: connections open, files in nginx's page cache
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                began = time.process_time()
                await ways[name]()
                results[name].append((time.process_time() - began) / len(urls) * 1e6)
            say(f"round {r + 1}: " + ", ".join(f"{n} {results[n][-1]:.1f} us" for n in ways))
    finally:
        await client.close()
        gets.close()
    wins = sum(s < a for a, s in zip(results["aiohttp"], results["small_gets"]))
    best = {n: min(v) for n, v in results.items()}
    return (f"cpu us per GET (min of {args.rounds}): aiohttp {best['aiohttp']:.1f}, small_gets "
            f"{best['small_gets']:.1f}; ratio small_gets/aiohttp {best['small_gets'] / best['aiohttp']:.2f}; "
            f"rounds favouring small_gets: {wins}/{args.rounds}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    run_bench(lambda work, children: run(args, work, children), prefix="nezha-small-get-cost-", keep=args.keep)


if __name__ == "__main__":
    main()
