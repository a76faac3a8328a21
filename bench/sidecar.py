#!/usr/bin/env python3
"""The sidecar deployment model (issue 23): warm reads from a sidecar against the cluster Service path.

    python bench/sidecar.py [--large-mib 1024] [--small-kib 100] [--small-count 200] [--runs 5]

Starts, as real `nezha cache` processes on 127.0.0.1: a cluster-tier node
with the local origin (nezha/dev/origin.py), a TCP relay in front of it
standing in for the cluster Service (testkit/relay.py), and a sidecar node
whose `--parent` is the relay. Every object is read once through the
sidecar (which fills it from the cluster, which fills it from the origin),
then, warm, measured both ways with curl:

- large: one object of --large-mib MiB, curl to /dev/null, MB/s, median
  of --runs, sidecar and Service path alternating so that drift on a
  shared machine hits both;
- small: --small-count objects of --small-kib KiB, all fetched by one curl
  on one keep-alive connection (what a loader reading a shard list does),
  objects/s, median of --runs, alternating too;
- the sidecar's RSS in MiB, idle: once it is ready, before any request
  (what every training pod pays), and again after the reads.

The Service path is client -> relay -> cluster node (a hit from its disk);
the sidecar path is client -> sidecar (a hit from its own disk). The relay
copies bytes in user space, where kube-proxy's NAT does not: it makes the
extra hop dearer than in a cluster, so read the ratios as "the tier that
skips a hop is never slower" (target >= 1.0), not as a cluster's figure.

The last line is machine-readable:

    ratios: large=<sidecar/service MB/s> small=<sidecar/service objects/s> idle_rss_mib=<sidecar, idle>

Everything listens on 127.0.0.1. Needs curl (installed with apt-get when
running as root) and psutil.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import CURL, KiB, MiB, BenchError, Children, Node, ensure_tool, write_random  # noqa: E402
from nezha.dev.origin import LocalOrigin  # noqa: E402
from testkit.relay import CountingRelay  # noqa: E402

HOST = "datasets.bench"


def _curl_large(url: str) -> float:
    out = subprocess.run([CURL, "-s", "-o", "/dev/null", "-H", f"Host: {HOST}", "-w", "%{speed_download} %{http_code}",
                          url + "/large.bin"], capture_output=True, text=True, check=True).stdout.split()
    if out[1] != "200":
        raise BenchError(f"{url}/large.bin answered {out[1]}")
    return float(out[0]) / 1e6


def _curl_small(url: str, count: int) -> float:
    """Objects per second: every small object by one curl on one connection."""
    argv = [CURL, "-s", "-H", f"Host: {HOST}", "-w", "%{http_code}\\n"]
    for i in range(count):
        argv += ["-o", "/dev/null", f"{url}/small/{i}.bin"]
    started = time.perf_counter()
    codes = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    seconds = time.perf_counter() - started
    if codes != ["200"] * count:
        raise BenchError(f"{url}: small objects answered {sorted(set(codes))}")
    return count / seconds


async def in_thread(fn, *args):
    # curl runs in a thread: the origin and the relay share this process and must keep serving.
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def rss_mib(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / MiB


async def hits(node: Node) -> float:
    return (await node.counters())["nezha_cache_hits_total"]


async def main(large_mib: int, small_kib: int, small_count: int, runs: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-sidecar-"))
    children = Children()
    origin = LocalOrigin(work / "origin")
    relay = None
    try:
        write_random(work / "origin" / "large.bin", large_mib * MiB)
        for i in range(small_count):
            write_random(work / "origin" / "small" / f"{i}.bin", small_kib * KiB)
        origin_url = await origin.start()
        cluster = Node(children, work, "cluster")
        await cluster.start(origins={HOST: origin_url})
        relay = CountingRelay("127.0.0.1", cluster.port)
        service = f"http://127.0.0.1:{relay.port}"
        sidecar = Node(children, work, "sidecar")
        await sidecar.start(origins={HOST: origin_url}, args=["--parent", service])
        await asyncio.sleep(1.0)  # let start-up settle before the idle figure
        assert sidecar.proc is not None
        idle_rss = rss_mib(sidecar.proc.pid)

        # Fill both tiers through the sidecar, as a first epoch would.
        async with aiohttp.ClientSession() as s:
            for path in ["/large.bin", *(f"/small/{i}.bin" for i in range(small_count))]:
                async with s.get(sidecar.url + path, headers={"Host": HOST}) as r:
                    if r.status != 200:
                        raise BenchError(f"first read of {path} through the sidecar answered {r.status}")
                    async for _ in r.content.iter_chunked(1 << 20):
                        pass
        await sidecar.settled()
        await cluster.settled()
        filled_gets = origin.gets  # the large object's fill may be parallel ranges: several GETs

        side_hits, cluster_hits = await hits(sidecar), await hits(cluster)
        large = {"sidecar": [], "service": []}
        small = {"sidecar": [], "service": []}
        for _ in range(runs):
            large["sidecar"].append(await in_thread(_curl_large, sidecar.url))
            large["service"].append(await in_thread(_curl_large, service))
            small["sidecar"].append(await in_thread(_curl_small, sidecar.url, small_count))
            small["service"].append(await in_thread(_curl_small, service, small_count))
        # Every measured read was a hit where it was meant to be: the sidecar's
        # from its own disk (the cluster not asked), the Service path's from the cluster's.
        want = runs * (1 + small_count)
        if await hits(sidecar) - side_hits != want or await hits(cluster) - cluster_hits != want:
            raise BenchError("a measured read was not a hit on the tier it was meant for")
        if origin.gets != filled_gets:
            raise BenchError("the origin was asked again during the warm reads")
        used_rss = rss_mib(sidecar.proc.pid)

        med = {k: statistics.median(v) for k, v in large.items()}
        smed = {k: statistics.median(v) for k, v in small.items()}
        print(f"large object: {large_mib} MiB, curl to /dev/null, median of {runs}")
        print(f"  warm from the sidecar          {med['sidecar']:10.1f} MB/s")
        print(f"  warm through the Service path  {med['service']:10.1f} MB/s (relay -> cluster node)")
        print(f"small objects: {small_count} x {small_kib} KiB, one curl, one connection, median of {runs}")
        print(f"  warm from the sidecar          {smed['sidecar']:10.1f} objects/s")
        print(f"  warm through the Service path  {smed['service']:10.1f} objects/s")
        print(f"sidecar RSS: {idle_rss:.1f} MiB idle (ready, no request yet), {used_rss:.1f} MiB after the reads")
        print(f"ratios: large={med['sidecar'] / med['service']:.3f} small={smed['sidecar'] / smed['service']:.3f} "
              f"idle_rss_mib={idle_rss:.1f}")
    finally:
        await children.stop_all()
        if relay is not None:
            relay.close()
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mib", type=int, default=1024, help="size of the large object (default 1024)")
    parser.add_argument("--small-kib", type=int, default=100, help="size of each small object (default 100)")
    parser.add_argument("--small-count", type=int, default=200, help="small objects (default 200)")
    parser.add_argument("--runs", type=int, default=5, help="measurements of each path (default 5)")
    a = parser.parse_args()
    try:
        ensure_tool(CURL, "curl")
    except BenchError as e:
        sys.exit(f"bench/sidecar.py: {e}")
    from nezha.logs import configure

    configure(level="warning", stream=sys.stderr)
    asyncio.run(main(a.large_mib, a.small_kib, a.small_count, a.runs))
