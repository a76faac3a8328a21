"""Cluster benchmark: relay cost, origin fetches during a node kill, ring propagation.

    python bench/cluster.py [--quick]

Runs a 3-node local cluster (real node processes, embedded index) against an
unthrottled local origin, and prints as its last line

    ratios: relay=<r> failover_origin_fetches=<n> ring_propagation_ms=<p99>

relay: warm throughput of one large object when the request enters through
a non-owner (relayed) divided by entering through the owner, same client
(curl to /dev/null), median of several runs each.
failover_origin_fetches: origin GETs caused while warm reads of replicated
objects continue through a node kill (SIGKILL of an owner).
ring_propagation_ms: p99 over repeated membership changes of the time until
every node reports the new epoch on /readyz.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import CURL, BenchError, ensure_tool, settled  # noqa: E402
from nezha.keys import key_for, parse_target  # noqa: E402
from nezha.config import Origin  # noqa: E402
from nezha.dev.local_cluster import LocalCluster  # noqa: E402
from nezha.dev.origin import LocalOrigin  # noqa: E402
from testkit.ports import free_run  # noqa: E402

HOST = "datasets.bench"


def _curl(url: str, path: str) -> float:
    out = subprocess.run([CURL, "-s", "-o", "/dev/null", "-H", f"Host: {HOST}", "-w", "%{speed_download} %{http_code}",
                          url + path], capture_output=True, text=True, check=True).stdout.split()
    if out[1] != "200":
        raise RuntimeError(f"{url}{path} answered {out[1]}")
    return float(out[0]) / 1e6


async def curl_mbps(url: str, path: str) -> float:
    # curl runs in a thread: the origin shares this event loop and must keep serving.
    return await asyncio.get_running_loop().run_in_executor(None, _curl, url, path)


async def readyz(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/readyz") as r:
        return await r.json()


async def propagation_ms(cluster: LocalCluster, rounds: int) -> list[float]:
    members = cluster.members()
    fewer = dict(list(members.items())[:-1])
    times = []
    async with aiohttp.ClientSession() as s:
        for i in range(rounds):
            target = fewer if i % 2 == 0 else members
            started = time.perf_counter()
            epoch = await cluster.publish(target)
            while True:
                states = await asyncio.gather(*(readyz(s, n.url) for n in cluster.nodes.values()))
                if all(st["ring_epoch"] == epoch for st in states):
                    break
                await asyncio.sleep(0.002)
            times.append((time.perf_counter() - started) * 1000)
    return times


async def main(quick: bool) -> None:
    large = (128 if quick else 512) * 1024 * 1024
    small_count = 20 if quick else 60
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-cluster-"))
    origin_dir = work / "origin"
    (origin_dir / "small").mkdir(parents=True)
    with open(origin_dir / "large.bin", "wb") as f:
        for _ in range(large // (4 << 20)):
            f.write(os.urandom(4 << 20))
    for i in range(small_count):
        (origin_dir / "small" / f"{i}.bin").write_bytes(os.urandom(256 * 1024))
    origin = LocalOrigin(origin_dir)
    cluster = None
    try:
        origin_url = await origin.start()
        served = Origin(host=HOST, upstream=origin_url)
        cluster = LocalCluster(nodes=3, origins=[served], data_dir=work / "cache", base_port=free_run(3), replicas=2)
        await cluster.start()
        urls = {n.id: n.url for n in cluster.nodes.values()}
        ring = cluster.index.membership.ring()

        def owners(path: str) -> list[str]:
            return ring.owners(key_for(parse_target(path, HOST), served), 2)

        # relay
        own = owners("/large.bin")
        outsider = next(n for n in urls if n not in own)
        await curl_mbps(urls[own[0]], "/large.bin")
        await settled(*urls.values())
        runs = 3 if quick else 5
        direct = statistics.median([await curl_mbps(urls[own[0]], "/large.bin") for _ in range(runs)])
        relayed = statistics.median([await curl_mbps(urls[outsider], "/large.bin") for _ in range(runs)])

        # failover: warm replicated objects, kill an owner, keep reading through the others
        paths = [f"/small/{i}.bin" for i in range(small_count)]
        victim = "node-1"
        entry = [u for n, u in urls.items() if n != victim]
        async with aiohttp.ClientSession() as s:
            for p in paths:
                async with s.get(entry[0] + p, headers={"Host": HOST}) as r:
                    await r.read()
        await settled(*urls.values())
        await asyncio.sleep(0.5)
        before = origin.gets
        failed_reads = 0
        async with aiohttp.ClientSession() as s:
            for round_ in range(6):
                if round_ == 2:
                    cluster.nodes[victim].proc.send_signal(signal.SIGKILL)
                for i, p in enumerate(paths):
                    async with s.get(entry[i % 2] + p, headers={"Host": HOST}) as r:
                        body = await r.read()
                        if r.status != 200 or len(body) != 256 * 1024:
                            failed_reads += 1
        failover_fetches = origin.gets - before
        cluster.nodes[victim].proc.wait()
        # ring propagation among the survivors
        del cluster.nodes[victim]
        times = await propagation_ms(cluster, 20 if quick else 100)
        p99 = statistics.quantiles(times, n=100, method="inclusive")[98] if len(times) >= 2 else times[0]

        print(f"large object: {large / 2**20:.0f} MiB, curl to /dev/null, median of {runs}")
        print(f"  warm via owner      {direct:10.1f} MB/s")
        print(f"  warm via non-owner  {relayed:10.1f} MB/s (relayed)")
        print(f"failover: {small_count} replicated 256 KiB objects x 6 rounds, {victim} SIGKILLed before round 3: "
              f"{failover_fetches} origin fetches, {failed_reads} failed reads")
        print(f"ring propagation over {len(times)} changes: p50 {statistics.median(times):.1f} ms, "
              f"p99 {p99:.1f} ms, max {max(times):.1f} ms")
        print(f"ratios: relay={relayed / direct:.3f} failover_origin_fetches={failover_fetches} "
              f"ring_propagation_ms={p99:.1f}")
    finally:
        if cluster is not None:
            await cluster.stop()
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller object and fewer rounds (under 2 minutes)")
    a = parser.parse_args()
    try:
        ensure_tool(CURL, "curl")
    except BenchError as e:
        sys.exit(f"bench/cluster.py: {e}")
    from nezha.logs import configure

    configure(level="warning", stream=sys.stderr)
    asyncio.run(main(a.quick))
