"""Many small files through one cache node, beside nginx `proxy_cache` and the origin direct.

    sudo python bench/small_files.py [--quick] [--objects N] [--seconds S] [--origin-rtt-ms MS ...]
                                     [--headline-rtt-ms MS] [--fills-only] [--redis-objects M]
                                     [--index-objects K] [--index-store DIR]

Needs root (network namespaces: testkit/netns.py) and a C compiler (the
delay line, testkit/delayline.py); refuses with one line otherwise.

An ImageNet-shaped dataset is many files of about 100 KiB; the first epoch
is a stream of cold fills, one per file. This measures what a node pays per
small object, in one run and on the same origin:

- the origin is Debian's nginx serving N files of 16 KiB from a folder
  (from the page cache);
- `nginx proxy_cache` in front of that origin, at one worker process and
  as shipped (`worker_processes auto`: one per CPU);
- one `nezha cache` node in front of it, at `--workers 1` and as shipped
  (no --workers: `auto`, a worker per usable CPU, cachenode/workers/plan.py).

Why both. The figures of earlier runs are per process: `small_fill_direct`
stays the node at `--workers 1` so they compare. But a new user's node
runs `auto` (two workers on a two-core box), and whether a first epoch is
"limited by the origin and the network, not by the node" is a question
about that node: `small_fill_direct_auto`. Each is held against nginx at
the same count (one worker, and `auto`), never across. What a second
worker does for cold fills (docs/cache-node.md, "Workers"): every fill is
the primary's. A follower answers plain hits only; a connection whose
request it cannot answer (a miss) it hands to the primary with its
descriptor, and the primary serves that connection until it reads hits
again (after 8 hits answered there it goes back to the follower). So
coalescing is exact across workers (a miss arriving at each worker for one
key is one origin fetch, the primary's), and a cold run's fills all go
through one process whatever the count: here, with wrk's keep-alive
connections and every path asked once (no coalescing at all), the second
worker adds the hand-over of its half of the connections and its copy of
the index to keep up, not fills. nginx's workers each fill (`proxy_cache_lock`
coalesces through the shared zone).

Twice over. First on loopback, no network anywhere (`small_fill_direct_loopback`):
the origin answers in microseconds at tens of thousands of requests a
second, so cache / direct there is only each cache's CPU per fill against
nginx's static files (nginx `proxy_cache` itself reads about 0.1). Then
with the origin at a distance, as every real dataset origin is: the origin
in a network namespace of its own behind a delay line (RTT/2 added each
way, and a new connection's handshake paid; testkit/delayline.py says why a
relay and not netem: this kernel has none), the node, nginx `proxy_cache`
and wrk together in a second namespace (in-cluster: nothing between them),
at each `--origin-rtt-ms` (default 0 5 20 50): fills/s direct, through the
node and through nginx (each at one worker and as shipped), and their
ratios. The 0 ms point differs from loopback by the relay and the
namespaces' link only.

The headline `small_fill_direct` is read at 20 ms (`--headline-rtt-ms`).
Why 20: AWS's S3 performance whitepaper ("Timeouts and Retries for
Latency-Sensitive Applications", docs.aws.amazon.com/whitepapers/latest/
s3-optimizing-performance-best-practices/) puts the median latency of small
requests (under 512 KB) "often in the range of tens of milliseconds"; 20 ms
is the low end of that, the hardest origin of the realistic ones for a
cache to keep up with (with 64 connections the direct rate is about
64 / RTT, so a nearer origin asks more fills per second of the node). The
brief behind this benchmark quoted 100-200 ms first-byte latency from AWS's
guidelines; the stored docs searched do not say that, so it is not used.
At 50 ms and beyond the direct rate (about 1,200/s and less) is one a
node's single worker keeps up with at 400 us of CPU per fill, if it has
that CPU.

The load is wrk with a Lua script that asks every path once (a thread
takes every other path, each connection the thread's next one): every
request through a cache is a cold fill, never a hit and never a join of a
fill in flight. A run lasts a fixed time; a path beyond the dataset answers
404, which wrk counts and the benchmark refuses (the dataset was too small
for the rate: pass a larger --objects). Against the origin direct the
script wraps around (the origin caches nothing, so nothing changes). Each
point has fresh caches (empty), and each cache's rounds ask the paths
after those it asked in its earlier rounds, so the fastest (nginx `auto`
on loopback, 16,000 fills/s on a quiet box) has the whole dataset for
its rounds: 150,000 objects with --quick (2 rounds of 3 s), 300,000
otherwise, enough for 12,000 fills/s at the default 8 s a run, 20,000
at --seconds 5; a faster cache needs a larger --objects. Beside
each cache's CPU per fill (its processes' sum), the share of its run they
were ready to run but waited for a CPU (/proc/PID/schedstat): on this
shared two-core machine that tells the others' load from a cache's own
limit (bench/small_side_by_side.py).

Printed as the last line:

    ratios: small_fill=<cache/nginx cold fills/s, loopback, one worker each>
            small_fill_direct=<cache/direct, origin at --headline-rtt-ms, --workers 1>
            small_fill_direct_auto=<the same, the node as shipped: workers auto>
            small_fill_direct_loopback=<cache/direct, origin on loopback>
            small_fill_direct_rtt<MS>=<cache/direct at each RTT, --workers 1>
            small_fill_direct_auto_rtt<MS>=<the same, workers auto>
            bytes_per_object=<node RSS growth / objects stored> restart_ms=<a fresh
            node process on a store of that many objects: spawn to first hit>
            redis_bytes_per_object=<Redis bytes per object per copy, three nodes,
            two copies each> fill_cpu=<node CPU per fill / nginx's, loopback>

(bytes_per_object, restart_ms and redis_bytes_per_object left out with --fills-only.)

bytes_per_object and restart_ms are measured at a million small objects
(`--index-objects`; 100,000 with --quick), on a store built with the
store's own writer, as bench/small_index.py measures them (its
`measure`): a cold run stores far too few objects for a node's RSS per
object to be more than its buffers' noise. restart_ms is not a node
stopped and started again: no node ran on that store before; a new node
process is spawned on its folder and asked stored objects until one is a
hit, which is what a restart's start-up does with a store it finds (the
same scan of the folder in the background, `/readyz` saying how far). redis_bytes_per_object: a three-node cluster (`nezha up`'s
LocalCluster) on a real redis-server, M objects filled through one node
with two owners per key; the sum of `MEMORY USAGE key SAMPLES 0` over every
key in Redis, less the same sum before the fills, divided by objects x 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (KiB, WRK, BenchError, Children, run_bench, Nginx, StaticFiles,  # noqa: E402
                           ensure_tool, interpreter, nginx_conf, nginx_version, settled, source_version)
from bench.small_index import measure  # noqa: E402
from bench.small_side_by_side import (CONNECTIONS, HOST, SIZES, Point, cold, get, path_of, say,  # noqa: E402
                                      side_by_side)
from cachenode.cli import worker_count  # noqa: E402
from testkit import delayline  # noqa: E402
from testkit.netns import Host, NetnsUnavailable, Network, check_available  # noqa: E402
from testkit.ports import free_port  # noqa: E402

# bench/small_fills_ab.py takes its runs from here.
__all__ = ["HOST", "cold", "get", "make_dataset", "path_of", "say"]

SIZE = 16 * KiB
# The origin's round trip small_fill_direct is read at (the docstring says why).
HEADLINE_RTT_MS = 20.0





@dataclass
class Plan:
    objects: int
    seconds: int
    redis_objects: int
    index_objects: int


def plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        p = Plan(objects=150_000, seconds=3, redis_objects=2000, index_objects=100_000)
    else:
        p = Plan(objects=300_000, seconds=8, redis_objects=20000, index_objects=1_000_000)
    if args.objects:
        p.objects = args.objects
    if args.seconds:
        p.seconds = args.seconds
    if args.redis_objects:
        p.redis_objects = args.redis_objects
    if args.index_objects:
        p.index_objects = args.index_objects
    return p



def make_dataset(root: Path, count: int, size: int = SIZE) -> None:
    """`count` files of `size` random bytes, 1000 per folder (a random block rotated per file: fast, all distinct)."""
    block = os.urandom(size * 2)
    for n in range(count):
        p = root / path_of(n).lstrip("/")
        if n % 1000 == 0:
            p.parent.mkdir(parents=True, exist_ok=True)
        at = n % size
        p.write_bytes(n.to_bytes(8, "big") + block[at:at + size - 8])
        # A year old, as a published dataset's files are: fresh for weeks by heuristic
        # (RFC 9111 §4.2.2), not stale a second after the fill as a file made just now.
        os.utime(p, (time.time() - 365 * 86400,) * 2)




async def redis_footprint(work: Path, p: Plan, origin_url: str) -> tuple[float, int]:
    """Redis bytes per object per copy in a three-node cluster, two copies each; and the objects counted."""
    import redis.asyncio as aioredis

    from nezha.config import Origin
    from nezha.dev.local_cluster import LocalCluster
    from testkit.ports import free_run
    from testkit.redis_server import RedisServer

    exe = shutil.which("redis-server")
    if exe is None:
        raise BenchError("redis-server is missing (apt-get install -y redis-server)")
    (work / "redis").mkdir()
    server = RedisServer(exe, work / "redis")
    server.start()
    cluster = LocalCluster(nodes=3, origins=[Origin(host=HOST, upstream=origin_url)], data_dir=work / "cluster",
                           base_port=free_run(3), replicas=2, redis_url=server.url)
    r = aioredis.from_url(server.url)
    try:
        await cluster.start(force=True)

        async def used() -> int:
            total = 0
            async for key in r.scan_iter(count=1000):
                total += await r.memory_usage(key, samples=0) or 0
            return total

        before = await used()
        entry = next(iter(cluster.nodes.values())).url
        sem = asyncio.Semaphore(32)
        async with aiohttp.ClientSession() as s:
            async def one(n: int) -> None:
                async with sem:
                    status, _, _ = await get(s, entry, path_of(n))
                    if status != 200:
                        raise BenchError(f"cluster answered {status} for {path_of(n)}")
            await asyncio.gather(*(one(n) for n in range(p.redis_objects)))
        await settled(*(n.url for n in cluster.nodes.values()))
        # The index is written off the data path (buffered): wait until it stops growing.
        last, still = -1, 0
        while still < 3:
            now = await used()
            still = still + 1 if now == last else 0
            last = now
            await asyncio.sleep(1.0)
        return (last - before) / (p.redis_objects * 2), p.redis_objects
    finally:
        await r.aclose()
        await cluster.stop(keep_ring=False)
        server.stop()




async def curve(children: Children, work: Path, root: Path, p: Plan, rounds: int, rtts: list[float],
                python: str) -> list[Point]:
    """`side_by_side` at each origin round trip: the origin in a namespace of its own behind a delay line
    (testkit/delayline.py, `rtt`/2 each way), the node, nginx and wrk together in another (in-cluster:
    nothing between them)."""
    net = Network(hosts=[Host("origin"), Host("client")])
    points = []
    with net:
        at = net.address("origin")
        with net.inside("origin"):
            origin = Nginx(children, work, "wan-origin", address=at)
            await origin.start(nginx_conf(StaticFiles(root=root), **SIZES))
        for rtt in rtts:
            with net.inside("origin"):
                port = free_port()
                line = await children.spawn(*delayline.argv((at, port), (at, origin.port), rtt / 2000),
                                            stdout=asyncio.subprocess.PIPE)
                assert line.stdout is not None
                if (await asyncio.wait_for(line.stdout.readline(), 30)).strip() != b"listening":
                    raise BenchError("the delay line did not start")
            with net.inside("client"):
                points.append(await side_by_side(children, work, f"http://{at}:{port}", p.objects, p.seconds, rounds,
                                                 f"rtt {rtt:g} ms", python))
            await children.stop(line)
        assert origin.proc is not None
        await children.stop(origin.proc)
    return points


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    p = plan(args)
    rtts = sorted(set(args.origin_rtt_ms))
    if args.headline_rtt_ms not in rtts:
        raise BenchError(f"--headline-rtt-ms {args.headline_rtt_ms:g} is not among --origin-rtt-ms {rtts}")
    python = interpreter(args.node_python)  # refused at once when it cannot run the node
    say(f"small files ({'quick' if args.quick else 'full'}): {os.cpu_count()} CPUs, load {os.getloadavg()}, "
        f"{p.objects} objects of {args.size} KiB, {p.seconds} s per run, origin RTTs {rtts} ms, work dir {work}")
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    root = work / "origin-files"
    await loop.run_in_executor(None, make_dataset, root, p.objects, args.size * KiB)
    await loop.run_in_executor(None, os.sync)  # the dataset's writeback must not load the disk during the runs
    rounds = 2 if args.quick else 3

    # The origin on loopback, no network between: the node's own cost, and the origin the rest uses.
    origin = Nginx(children, work, "origin")
    await origin.start(nginx_conf(StaticFiles(root=root), **SIZES))
    loopback = await side_by_side(children, work, origin.url, p.objects, p.seconds, rounds, "loopback",
                                  args.node_python)
    points = await curve(children, work, root, p, rounds, rtts, args.node_python)

    say(f"small_files: {time.monotonic() - started:.0f} s so far; code: {source_version()}; nginx: {nginx_version()}; "
        f"nodes on {python}; load {os.getloadavg()}")
    say(f"  cold fills/s of {args.size} KiB objects, {CONNECTIONS} wrk connections, median of {rounds} rounds; "
        f"each cache at one worker and as shipped (auto: {worker_count('auto')} here), (its fills/s / direct):")
    for point in [loopback, *points]:
        say(point.line())
    head = next(pt for pt, rtt in zip(points, rtts) if rtt == args.headline_rtt_ms)
    small_fill = loopback.caches["node"].rps / loopback.caches["nginx"].rps
    fill_cpu = loopback.caches["node"].cpu / loopback.caches["nginx"].cpu
    curve_ratios = " ".join(f"small_fill_direct_rtt{rtt:g}={pt.ratio('node'):.3f}" for pt, rtt in zip(points, rtts))
    auto_ratios = " ".join(f"small_fill_direct_auto_rtt{rtt:g}={pt.ratio('node auto'):.3f}"
                           for pt, rtt in zip(points, rtts))
    say(f"  small_fill        cache / nginx cold (loopback)            {small_fill:6.3f}  target >= 1.0")
    say(f"  small_fill_direct cache / direct, origin {args.headline_rtt_ms:g} ms away        "
        f"{head.ratio('node'):6.3f}  target >= 0.8 (--workers 1)")
    say(f"  small_fill_direct_auto the same, the node as shipped       {head.ratio('node auto'):6.3f}  target >= 0.8 "
        f"(nginx as shipped: {head.ratio('nginx auto'):.3f})")
    say(f"  small_fill_direct_loopback cache / direct, origin on loopback {loopback.ratio('node'):6.3f}"
        "  (the node's CPU against nginx's static files: no network)")
    ratios = (f"ratios: small_fill={small_fill:.3f} small_fill_direct={head.ratio('node'):.3f} "
              f"small_fill_direct_auto={head.ratio('node auto'):.3f} "
              f"small_fill_direct_loopback={loopback.ratio('node'):.3f} {curve_ratios} {auto_ratios}")
    if not args.fills_only:
        say(f"  a store of {p.index_objects} small objects, for memory per object and restart:")
        (work / "index").mkdir()
        index = await measure(work / "index", children, p.index_objects, args.index_store)
        redis_bpo, redis_n = await redis_footprint(work, p, origin.url)
        say(f"  Redis: {redis_bpo:.0f} bytes per object per copy ({redis_n} objects, three nodes, two copies)")
        at = f"at {p.index_objects:,} objects; target at 1 M"
        say(f"  bytes_per_object  node RSS / object    {index.bytes_per_object:6.0f}  target <= 300 ({at})")
        say(f"  restart_ms        restart to first hit {index.restart_ms:6.0f}  target < 1000 ({at})")
        say(f"  redis_bytes_per_object  per copy       {redis_bpo:6.0f}  target <= 150")
        ratios += (f" bytes_per_object={index.bytes_per_object:.0f} restart_ms={index.restart_ms:.0f} "
                   f"redis_bytes_per_object={redis_bpo:.0f}")
    say(f"  fill_cpu          node CPU per fill / nginx's (loopback) {fill_cpu:6.2f}  (a reading for a loaded machine)")
    return ratios + f" fill_cpu={fill_cpu:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer objects, shorter runs (a few minutes)")
    ap.add_argument("--objects", type=int, default=0, help="objects in the dataset (a cold run must not outlast it)")
    ap.add_argument("--seconds", type=int, default=0, help="length of each wrk run")
    ap.add_argument("--redis-objects", type=int, default=0, help="objects filled into the three-node cluster")
    ap.add_argument("--index-objects", type=int, default=0, help="small objects in the store measured for "
                    "bytes_per_object and restart_ms (default 1,000,000, about 15 minutes; 100,000 with --quick)")
    ap.add_argument("--index-store", type=Path, help="build that store here once and reuse it in later runs")
    ap.add_argument("--size", type=int, default=SIZE // KiB, help="KiB per object (default 16); the node's "
                    "small-object path covers objects up to its small_object_max (NEZHA_SMALL_OBJECT_MAX=0: none)")
    ap.add_argument("--origin-rtt-ms", type=float, nargs="+", default=[0, 5, 20, 50], help="the origin's round "
                    "trips to measure at, in ms (default 0 5 20 50)")
    ap.add_argument("--headline-rtt-ms", type=float, default=HEADLINE_RTT_MS, help="the round trip small_fill_direct "
                    f"is read at (default {HEADLINE_RTT_MS:g}; see the docstring)")
    ap.add_argument("--fills-only", action="store_true", help="the cold fill figures only: skip bytes_per_object, "
                    "restart_ms and redis_bytes_per_object")
    ap.add_argument("--node-python", default=sys.executable, help="the interpreter the nodes run on (default: "
                    "this one); a venv's python with the project installed (docs/benchmarks.md, \"The interpreter\")")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    try:
        check_available()
        delayline.binary()
    except (NetnsUnavailable, delayline.DelayLineUnavailable) as e:
        sys.exit(f"small_files: {e}")
    ensure_tool(WRK, "wrk")
    run_bench(lambda work, children: run(args, work, children), prefix="nezha-small-", keep=args.keep)


if __name__ == "__main__":
    main()
