#!/usr/bin/env python3
"""Warm epochs on the connections of the cold one: which worker answers their hits.

A dataset loader keeps its connections alive across epochs. With
`--workers`, a follower hands the primary every connection whose request
it cannot answer (a miss), so over a cold first epoch every connection the
kernel gave a follower crosses to the primary; `front/giving_back.py`
returns such a connection to its follower once it reads hits again. This
runs one `nezha cache --workers N` node (default 2) in front of a local
origin, a client of `--connections` kept-alive connections (aiohttp, one
session) reading `--objects` objects of 16 KiB: a cold pass, then
`--passes` warm passes on the same connections, then, as the reference, one
warm pass on fresh connections (where the kernel alone spreads them). For
each pass: requests per second, and the share of its hits each worker
answered (from the node's `request_completed` lines, `--log-level info`).

    python bench/warm_connections.py [--objects 2000] [--connections 16] [--passes 2] [--workers 2]

Figures (the last line):
    ratios: warm_follower_share=<followers' share of the warm passes' hits on the cold pass's connections,
                                 divided by their share on fresh connections: 1.0 is an even spread>
            warm_rate=<warm passes' requests/s over the fresh pass's>

Everything listens on 127.0.0.1 and stops with the script. Needs only
`pip install -e '.[test]'`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from testkit.ports import free_port  # noqa: E402
from testkit.waits import until_http  # noqa: E402

HOST = "datasets.bench"
SIZE = 16 * 1024


async def one_pass(session: aiohttp.ClientSession, url: str, objects: int, connections: int, log: Path,
                   ) -> tuple[float, collections.Counter, collections.Counter]:
    """Every object once on `session`: requests/s, the X-Nezha-Cache answers, and the workers that answered."""
    mark = log.stat().st_size
    sem = asyncio.Semaphore(connections)

    async def get(i: int) -> str:
        async with sem:
            async with session.get(f"{url}/obj/{i}", headers={"Host": HOST}) as r:
                body = await r.read()
                if r.status != 200 or len(body) != SIZE:
                    raise SystemExit(f"/obj/{i}: {r.status} with {len(body)} bytes")
                return r.headers.get("X-Nezha-Cache", "")

    began = time.monotonic()
    answers = collections.Counter(await asyncio.gather(*(get(i) for i in range(objects))))
    rate = objects / (time.monotonic() - began)
    await asyncio.sleep(1.0)  # each worker's last lines written
    with open(log) as f:
        f.seek(mark)
        lines = [json.loads(line) for line in f if line.startswith("{")]
    workers = collections.Counter(e.get("worker", 0) for e in lines if e.get("event") == "request_completed")
    return rate, answers, workers


def followers_share(workers: collections.Counter) -> float:
    """The share of a pass's requests the followers (every worker but 0, the primary) answered."""
    return sum(c for w, c in workers.items() if w != 0) / max(1, sum(workers.values()))


async def run(args: argparse.Namespace, work: Path) -> str:
    body = os.urandom(SIZE)
    app = web.Application()

    async def serve(_: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Cache-Control": "max-age=3600"})

    app.router.add_get("/{path:.*}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    origin_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", origin_port).start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / "node.log"
    with open(log, "w") as out:
        node = subprocess.Popen(
            [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(work / "data"),
             "--workers", str(args.workers), "--log-level", "info",
             "--origin", f"{HOST}=http://127.0.0.1:{origin_port}"],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        await until_http(f"{url}/healthz", timeout=120, proc=node, what="nezha cache")
        while sum(1 for line in open(log) if '"worker_listening"' in line) < args.workers - 1:
            await asyncio.sleep(0.2)  # every follower serves
        print(f"warm connections: {args.objects} objects of 16 KiB, {args.connections} kept-alive connections, "
              f"--workers {args.workers}, load {os.getloadavg()[0]:.1f}", flush=True)
        rates, shares = [], []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.connections)) as session:
            for n in range(args.passes + 1):
                rate, answers, workers = await one_pass(session, url, args.objects, args.connections, log)
                name = "cold" if n == 0 else f"warm {n}"
                followers = followers_share(workers)
                print(f"  {name:>7} (same connections): {rate:7.0f} req/s  {dict(answers)}  "
                      f"by worker {dict(sorted(workers.items()))}  followers {followers:.1%}", flush=True)
                if n:
                    rates.append(rate)
                    shares.append(followers)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.connections)) as session:
            rate, answers, workers = await one_pass(session, url, args.objects, args.connections, log)
        fresh = followers_share(workers)
        print(f"  {'fresh':>7} (new connections):  {rate:7.0f} req/s  {dict(answers)}  "
              f"by worker {dict(sorted(workers.items()))}  followers {fresh:.1%}", flush=True)
        share = sum(shares) / len(shares) / fresh if fresh else 0.0
        return f"ratios: warm_follower_share={share:.3f} warm_rate={sum(rates) / len(rates) / rate:.3f}"
    finally:
        node.terminate()
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--passes", type=int, default=2, help="warm passes on the cold pass's connections")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nezha-warm-") as work:
        print(asyncio.run(run(args, Path(work))))


if __name__ == "__main__":
    main()
