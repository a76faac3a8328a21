"""Cluster benchmark: relay cost, origin fetches during a node kill, ring propagation, replication cost.

    python bench/cluster.py [--quick]
    python bench/cluster.py --replication [--quick]   # only the replication cost

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

--replication: the cost of replicating a burst of small objects (16 KiB),
batched (replica_batch 64, the default) against one by one (replica_batch
0), each on a fresh 3-node cluster with two owners per key, in the same run.
Per 1,000 objects replicated: the requests between nodes (internal requests
at the receivers plus the copy requests the senders answered), the CPU
seconds of the three node processes (fills included, the same in both),
and the seconds from the burst's start until the last replica was stored
(replicas whose copy failed are counted as missing). Last line:

    replication: requests=<batched/one-by-one> cpu=<ratio> seconds=<ratio>
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
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


async def _metric_sum(session: aiohttp.ClientSession, urls: list[str], pattern: str) -> float:
    """The sum over nodes of the sample `pattern` (a metric name and labels) of each /metrics."""
    total = 0.0
    for url in urls:
        async with session.get(url + "/metrics") as r:
            found = re.search(rf"^{re.escape(pattern)} (\S+)$", await r.text(), re.M)
        total += float(found.group(1)) if found else 0.0
    return total


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes `pids` have used so far (/proc/<pid>/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


async def replication_cost(work: Path, origin_url: str, *, count: int, batch: int) -> dict[str, float]:
    """Fill `count` small objects on a fresh 3-node cluster, two owners each, with
    `replica_batch` `batch`; the requests, CPU and seconds until every replica is stored."""
    served = Origin(host=HOST, upstream=origin_url)
    cluster = LocalCluster(nodes=3, origins=[served], data_dir=work / f"replicas-{batch}", base_port=free_run(3),
                           replicas=2, node_settings={"replica_batch": batch})
    await cluster.start()
    try:
        urls = [n.url for n in cluster.nodes.values()]
        by_id = {n.id: n.url for n in cluster.nodes.values()}
        ring = cluster.index.membership.ring()
        pids = [n.proc.pid for n in cluster.nodes.values()]
        paths = [f"/rep/{i}.bin" for i in range(count)]
        first = {p: by_id[ring.owners(key_for(parse_target(p, HOST), served), 2)[0]] for p in paths}
        copy_requests = ('nezha_requests_total{cache="internal"}', 'nezha_requests_total{cache="hit"}')
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:
            before = sum([await _metric_sum(s, urls, m) for m in copy_requests])
            cpu_before = _cpu_seconds(pids)
            started = time.perf_counter()

            async def fill(p: str) -> None:
                async with s.get(first[p] + p, headers={"Host": HOST}) as r:
                    if r.status != 200 or len(await r.read()) != 16384:
                        raise BenchError(f"{p}: {r.status}")

            await asyncio.gather(*(fill(p) for p in paths))
            # Until every replica is stored, or none came for 5 s (a copy that failed is
            # missing for good: the next miss fills it): the time of the last one stored.
            stored, last = 0.0, time.perf_counter()
            while stored < 2 * count and time.perf_counter() - last < 5:
                now = await _metric_sum(s, urls, "nezha_stored_objects")
                if now > stored:
                    stored, last = now, time.perf_counter()
                await asyncio.sleep(0.01)
            seconds = last - started
            cpu = _cpu_seconds(pids) - cpu_before
            # During the burst every client read is a miss: the hits are the peers' copy requests.
            requests = sum([await _metric_sum(s, urls, m) for m in copy_requests]) - before
        per = 1000 / count
        return {"requests": requests * per, "cpu": cpu * per, "seconds": seconds * per,
                "missing": 2 * count - stored}
    finally:
        await cluster.stop()


async def replication(quick: bool) -> None:
    count = 600 if quick else 3000
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-replicas-"))
    (work / "origin" / "rep").mkdir(parents=True)
    for i in range(count):
        (work / "origin" / "rep" / f"{i}.bin").write_bytes(os.urandom(16384))
    origin = LocalOrigin(work / "origin")
    try:
        origin_url = await origin.start()
        one = await replication_cost(work, origin_url, count=count, batch=0)
        batched = await replication_cost(work, origin_url, count=count, batch=64)
        print(f"replication of {count} objects of 16 KiB, 3 nodes, 2 owners each; per 1,000 objects replicated:")
        for name, got in (("one by one", one), ("batched (64)", batched)):
            print(f"  {name:13} {got['requests']:7.0f} requests  {got['cpu']:6.2f} CPU s (fills included)  "
                  f"{got['seconds']:6.2f} s until the last replica was stored; {got['missing']:.0f} replicas "
                  f"missing (copies that failed)")
        print(f"replication: requests={batched['requests'] / one['requests']:.3f} "
              f"cpu={batched['cpu'] / one['cpu']:.3f} seconds={batched['seconds'] / one['seconds']:.3f}")
    finally:
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


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
    parser.add_argument("--replication", action="store_true",
                        help="only the cost of replicating small objects, batched against one by one")
    a = parser.parse_args()
    try:
        ensure_tool(CURL, "curl")
    except BenchError as e:
        sys.exit(f"bench/cluster.py: {e}")
    from nezha.logs import configure

    configure(level="warning", stream=sys.stderr)
    asyncio.run(replication(a.quick) if a.replication else main(a.quick))
