"""A dataset larger than the cache, read epoch after epoch.

Side by side in one run, on the same read sequences:
- the cache node(s), as `nezha cache` processes against a local origin that
  counts its requests (a read the origin did not serve was served by the tier);
- an LRU of the same capacity, simulated here in pure Python (what nginx,
  Varnish and the store before the policy evict by);
- nginx `proxy_cache` with `max_size` at the same capacity (its hit ratio from
  $upstream_cache_status, and its disk use beside it: nginx's cache manager
  evicts after the fact, so it overshoots `max_size` in a short run).

Figures (the last line):
    ratios: epoch_shuffled=<hit ratio, epochs 2..E, one node at half the dataset>
            epoch_sequential=<the same, in one fixed order>
            epoch_cluster=<reads without the origin, epochs 2..E, 3 nodes, 2 owners, dataset = summed capacity>
            zipf_vs_lru=<hit ratio / LRU's, Zipf 0.9 over 20 times the capacity>
            lru_shuffled=... lru_sequential=... nginx_shuffled=... nginx_sequential=... nginx_disk_mb=...
Targets: epoch_shuffled, epoch_sequential >= 0.45 (optimum 0.5); epoch_cluster >= 0.85; zipf_vs_lru >= 1.0.

    python bench/epochs.py [--quick] [--seed N]

Needs nginx (installed with apt-get when run as root) and redis-server.
Everything listens on 127.0.0.1 and stops with the script.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import NGINX, Children, Nginx, Node, ProxyCache, ensure_tool, nginx_conf  # noqa: E402
from testkit.ports import free_port, free_run  # noqa: E402
from testkit.redis_server import RedisServer  # noqa: E402
from testkit.tools import require_tool  # noqa: E402

HOST = "data.example.org"
SIZE = 4096



class Origin:
    """A local origin of SIZE-byte objects at any path; counts what it served."""

    def __init__(self) -> None:
        self.served = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
        self.served += 1
        path = request.path
        return web.Response(body=(path.encode() * (SIZE // len(path) + 1))[:SIZE],
                            headers={"Cache-Control": "max-age=86400"})

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner


class LRU:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: OrderedDict[str, None] = OrderedDict()

    def read(self, path: str) -> bool:
        if path in self.held:
            self.held.move_to_end(path)
            return True
        self.held[path] = None
        if len(self.held) > self.capacity:
            self.held.popitem(last=False)
        return False


def epochs(paths: list[str], count: int, *, shuffled: bool, rng: random.Random) -> list[list[str]]:
    runs = []
    for _ in range(count):
        order = list(paths)
        if shuffled:
            rng.shuffle(order)
        runs.append(order)
    return runs


def zipf(paths: list[str], reads: int, rng: random.Random, alpha: float = 0.9) -> list[str]:
    ranked = list(paths)
    rng.shuffle(ranked)
    return rng.choices(ranked, weights=[1 / (r + 1) ** alpha for r in range(len(ranked))], k=reads)


def lru_ratio(capacity: int, runs: list[list[str]]) -> float:
    lru = LRU(capacity)
    for p in runs[0]:
        lru.read(p)
    later = [p for run in runs[1:] for p in run]
    return sum(lru.read(p) for p in later) / len(later)


async def through(session: aiohttp.ClientSession, urls: list[str], runs: list[list[str]], origin: Origin,
                  *, settle=None) -> float:
    """Reads of `runs` spread over `urls`; the share of reads after the first run the origin did not serve."""
    after = 0
    for n, run in enumerate(runs):
        if n == 1:
            after = origin.served
        for i, p in enumerate(run):
            async with session.get(urls[i % len(urls)] + p, headers={"Host": HOST}) as r:
                await r.read()
                if r.status != 200:
                    raise SystemExit(f"{urls[i % len(urls)]}{p}: status {r.status}")
        if settle is not None:
            await settle()
    later = sum(len(run) for run in runs[1:])
    return 1 - (origin.served - after) / later


async def nginx_ratio(session: aiohttp.ClientSession, url: str, runs: list[list[str]]) -> float:
    hits = later = 0
    for n, run in enumerate(runs):
        for p in run:
            async with session.get(url + p, headers={"Host": HOST}) as r:
                await r.read()
                if n:
                    later += 1
                    hits += r.headers.get("X-Nginx-Cache") == "HIT"
    return hits / later


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer objects and epochs (about a minute)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    objects, count = (200, 4) if args.quick else (1000, 5)
    ensure_tool(NGINX, "nginx")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="nezha-epochs-"))
    children = Children()
    origin = Origin()
    runner = await origin.start()
    ratios: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession() as session:
            paths = [f"/train/{i:06d}.jpg" for i in range(objects)]
            capacity = objects // 2
            for mode, shuffled in (("shuffled", True), ("sequential", False)):
                runs = epochs(paths, count, shuffled=shuffled, rng=rng)
                node = Node(children, work, f"node-{mode}")
                await node.start(origins={HOST: origin.url}, args=["--capacity", str(capacity * SIZE),
                                                                     "--hot-reads", "0"])
                ratios[f"epoch_{mode}"] = await through(session, [node.url], runs, origin, settle=node.settled)
                await children.stop(node.proc)
                ratios[f"lru_{mode}"] = lru_ratio(capacity, runs)
                nginx = Nginx(children, work, f"nginx-{mode}")
                # max_size at the cache node's capacity; no lock, sendfile off: a hit ratio is measured, not speed.
                await nginx.start(nginx_conf(ProxyCache(upstream=origin.url, zone="epochs", keys_zone="4m",
                                                        max_size=capacity * SIZE, lock=False),
                                             by="bench/epochs.py", sendfile=False))
                ratios[f"nginx_{mode}"] = await nginx_ratio(session, nginx.url, runs)
                ratios[f"nginx_{mode}_disk_mb"] = disk_bytes(nginx.prefix / "cache") / 1e6
                await children.stop(nginx.proc)
            ratios["capacity_mb"] = capacity * SIZE / 1e6

            # Zipf 0.9 over 20 times the capacity, one node.
            catalogue = [f"/hub/{i:06d}.bin" for i in range(20 * (objects // 20))]
            zcap = len(catalogue) // 20
            reads = zipf(catalogue, 25 * len(catalogue) // (1 if not args.quick else 2), rng)
            warm = len(reads) // 5
            node = Node(children, work, "node-zipf")
            await node.start(origins={HOST: origin.url}, args=["--capacity", str(zcap * SIZE), "--hot-reads", "0"])
            ours = await through(session, [node.url], [reads[:warm], reads[warm:]], origin, settle=node.settled)
            await children.stop(node.proc)
            lru = lru_ratio(zcap, [reads[:warm], reads[warm:]])
            ratios["zipf_hit_ratio"], ratios["zipf_lru"] = ours, lru
            ratios["zipf_vs_lru"] = ours / lru if lru else float("inf")

            # Three nodes, two owners per key, a dataset of their summed capacity.
            from nezha.config import Origin as Served
            from nezha.dev.local_cluster import LocalCluster

            redis = RedisServer(require_tool("redis-server"), work)
            redis.start()
            per_node = objects // 3
            cluster = LocalCluster(nodes=3, origins=[Served(host=HOST, upstream=origin.url)],
                                   data_dir=work / "cluster", base_port=free_run(3), replicas=2,
                                   redis_url=redis.url, node_settings={"capacity": per_node * SIZE, "hot_reads": 0})
            await cluster.start()
            try:
                urls = [n.url for n in cluster.nodes.values()]
                from bench.harness import settled

                runs = epochs([f"/set/{i:06d}.jpg" for i in range(3 * per_node)], count, shuffled=True, rng=rng)
                ratios["epoch_cluster"] = await through(session, urls, runs, origin,
                                                        settle=lambda: settled(*urls))
            finally:
                await cluster.stop()
                redis.stop(kill=True)
    finally:
        await children.stop_all()
        await runner.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    order = ["epoch_shuffled", "epoch_sequential", "epoch_cluster", "zipf_vs_lru", "lru_shuffled", "lru_sequential",
             "nginx_shuffled", "nginx_sequential", "nginx_shuffled_disk_mb", "nginx_sequential_disk_mb",
             "capacity_mb", "zipf_hit_ratio", "zipf_lru"]
    print("ratios: " + " ".join(f"{k}={ratios[k]:.3f}" for k in order))


if __name__ == "__main__":
    asyncio.run(main())
