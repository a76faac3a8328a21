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
- `nginx proxy_cache` in front of that origin, one worker process;
- one `nezha cache` node (`--workers 1`) in front of it.

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
node and through nginx, and their ratios. The 0 ms point differs from
loopback by the relay and the namespaces' link only.

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
node's single worker keeps up with at 400 us of CPU per fill, and the
ratio there says little about the node.

The load is wrk with a Lua script that asks every path once (a thread
takes every other path, each connection the thread's next one): every
request through a cache is a cold fill, never a hit and never a join of a
fill in flight. A run lasts a fixed time; a path beyond the dataset answers
404, which wrk counts and the benchmark refuses (the dataset was too small
for the rate: pass a larger --objects). Against the origin direct the
script wraps around (the origin caches nothing, so nothing changes). Each
point has a fresh node and nginx (empty caches), so the points ask the
same paths. Beside the node's CPU per fill, the share of its run it was
ready to run but waited for a CPU (/proc/PID/schedstat): on this shared
two-core machine that tells the others' load from the node's own limit.

Printed as the last line:

    ratios: small_fill=<cache/nginx cold fills/s, loopback>
            small_fill_direct=<cache/direct, origin at --headline-rtt-ms>
            small_fill_direct_loopback=<cache/direct, origin on loopback>
            small_fill_direct_rtt<MS>=<cache/direct at each RTT>
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
import re
import statistics
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (KiB, WRK, BenchError, Children, run_bench, Nginx, Node, ProxyCache,  # noqa: E402
                           StaticFiles, ensure_tool, nginx_conf, nginx_version, settled, source_version)
from bench.small_index import measure  # noqa: E402
from cachenode.cli import worker_count  # noqa: E402
from cachenode.workers.supervisor import ROLE_ENV  # noqa: E402
from testkit import delayline  # noqa: E402
from testkit.netns import Host, NetnsUnavailable, Network, check_available  # noqa: E402
from testkit.ports import free_port  # noqa: E402
from nezha.wire import CACHE_HEADER  # noqa: E402

HOST = "images.bench"
SIZE = 16 * KiB
CONNECTIONS = 64
# The origin's round trip small_fill_direct is read at (the docstring says why).
HEADLINE_RTT_MS = 20.0



# Every path once: thread t of T asks paths t, t+T, t+2T, ... Past the end:
# wrap around (the origin direct) or a path the origin does not have (404,
# which the benchmark refuses: the run outlasted its dataset).
LUA = """\
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
function init(args)
  i = id
end
function request()
  local n = i
  i = i + %(threads)d
  if n >= %(count)d then
    if %(wrap)s then n = n %% %(count)d else return wrk.format("GET", "/beyond/" .. n, {["Host"] = "%(host)s"}) end
  end
  n = n + %(start)d
  return wrk.format("GET", "/d/" .. math.floor(n / 1000) .. "/" .. n .. ".bin", {["Host"] = "%(host)s"})
end
"""


@dataclass
class Plan:
    objects: int
    seconds: int
    redis_objects: int
    index_objects: int


def plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        p = Plan(objects=100_000, seconds=3, redis_objects=2000, index_objects=100_000)
    else:
        p = Plan(objects=150000, seconds=8, redis_objects=20000, index_objects=1_000_000)
    if args.objects:
        p.objects = args.objects
    if args.seconds:
        p.seconds = args.seconds
    if args.redis_objects:
        p.redis_objects = args.redis_objects
    if args.index_objects:
        p.index_objects = args.index_objects
    return p


def path_of(n: int) -> str:
    return f"/d/{n // 1000}/{n}.bin"


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


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class WrkRun:
    rps: float
    requests: int
    non_2xx: int
    errors: str | None


async def wrk(children: Children, url: str, script: Path, seconds: int) -> WrkRun:
    out = await children.run(WRK, "-t2", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script),
                             url, timeout=seconds + 60)
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    n = re.search(r"(\d+) requests in", out)
    if not m or not n:
        raise BenchError(f"cannot read wrk output:\n{out}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    return WrkRun(rps=float(m.group(1)), requests=int(n.group(1)), non_2xx=int(bad.group(1)) if bad else 0,
                  errors=sock.group(1) if sock else None)


def script(work: Path, name: str, start: int, count: int, *, wrap: bool) -> Path:
    path = work / f"{name}.lua"
    path.write_text(LUA % {"threads": 2, "start": start, "count": count, "wrap": "true" if wrap else "false",
                           "host": HOST})
    return path


async def cold(children: Children, url: str, work: Path, start: int, count: int, seconds: int,
               what: str) -> WrkRun:
    """Cold fills of objects [start, start + count) for `seconds`: each asked once."""
    run = await wrk(children, url, script(work, what, start, count, wrap=False), seconds)
    if run.non_2xx or run.errors:
        raise BenchError(f"{what}: {run.non_2xx} answers not 2xx, socket errors {run.errors}: the run asked "
                         f"past its {count} objects (pass a larger --objects) or the server failed")
    return run


async def get(session: aiohttp.ClientSession, url: str, path: str) -> tuple[int, str | None, bytes]:
    async with session.get(url + path, headers={"Host": HOST}) as r:
        return r.status, r.headers.get(CACHE_HEADER), await r.read()


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


@dataclass
class Cache:
    """One cache in a side-by-side run, and what its rounds measured."""

    name: str  # "node", "nginx" (one worker each), "node auto", "nginx auto" (as shipped: a worker per CPU)
    url: str
    pids: list[int]  # the processes that serve: the node's one, or its workers; nginx's master and workers
    label: dict[int, str]  # pid -> what it is, for the CPU shares printed ("primary", "follower", ...)
    rps: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # CPU seconds per fill, its processes' sum
    waited: list[float] = field(default_factory=list)  # the share of a run its processes were ready but waited

    def median(self) -> "Measured":
        return Measured(rps=statistics.median(self.rps), cpu=statistics.median(self.cpu),
                        waited=statistics.median(self.waited))


@dataclass
class Measured:
    rps: float  # cold fills/s, the median of the rounds
    cpu: float  # CPU seconds per fill
    waited: float  # the share of a run's seconds its serving processes were ready to run but waited for a CPU


@dataclass
class Point:
    """One origin, the ways to it side by side: the origin direct, and through each cache (`CACHES`)."""

    where: str
    direct: float
    caches: dict[str, Measured]

    def ratio(self, name: str) -> float:
        return self.caches[name].rps / self.direct

    def line(self) -> str:
        c = self.caches
        one = "  ".join(f"{name} {c[name].rps:6.0f}/s ({self.ratio(name):5.3f})" for name in CACHES)
        return (f"  {self.where:>14}: direct {self.direct:7.0f}/s  {one}  node/nginx {c['node'].rps / c['nginx'].rps:5.3f}"
                f"  auto {c['node auto'].rps / c['nginx auto'].rps:5.3f}  CPU us per fill: node "
                f"{c['node'].cpu * 1e6:.0f}, auto {c['node auto'].cpu * 1e6:.0f}; waited for a CPU: node "
                f"{c['node'].waited:.0%}, auto {c['node auto'].waited:.0%}")


SIZES = dict(by="bench/small_files.py", worker_connections=4096, nofile=65536)
# Each cache at one worker (the figures of earlier runs) and as shipped: nginx's `worker_processes auto` and the
# node's default `workers: auto`, a worker per usable CPU on both.
CACHES = ("node", "nginx", "node auto", "nginx auto")


async def start_caches(children: Children, work: Path, origin_url: str, tag: str) -> list[tuple[Cache, object]]:
    """A fresh nginx `proxy_cache` and a fresh node, each at one worker and as shipped, on 127.0.0.1 of the
    caller's namespace: each cache with its server object."""
    import psutil

    started: list[tuple[Cache, object]] = []
    for name in CACHES:
        auto = name.endswith("auto")
        if name.startswith("nginx"):
            proxy = Nginx(children, work, f"{name.replace(' ', '-')}-{tag}")
            await proxy.start(nginx_conf(ProxyCache(upstream=origin_url, keys_zone="64m", keepalive=CONNECTIONS),
                                         **{**SIZES, "workers": "auto" if auto else 1}))
            assert proxy.proc is not None
            root = psutil.Process(proxy.proc.pid)
            kids = root.children()
            label = {root.pid: "master", **{k.pid: "worker" for k in kids}}
            started.append((Cache(name, proxy.url, [root.pid, *(k.pid for k in kids)], label), proxy))
            continue
        node = Node(children, work, f"{name.replace(' ', '-')}-{tag}")
        await node.start(origins={HOST: origin_url}, workers=None if auto else 1)
        assert node.proc is not None
        if auto:
            await node.serving_workers(worker_count("auto"))
            kids = psutil.Process(node.proc.pid).children()
            label = {node.proc.pid: "supervisor", **{k.pid: k.environ().get(ROLE_ENV, "worker") for k in kids}}
            pids = [node.proc.pid, *(k.pid for k in kids)]
        else:
            pids, label = [node.proc.pid], {node.proc.pid: "node"}
        started.append((Cache(name, node.url, pids, label), node))
    return started


async def side_by_side(children: Children, work: Path, origin_url: str, p: Plan, rounds: int, where: str) -> Point:
    """Cold fills/s from `origin_url` direct and through each of `CACHES`, fresh, rounds turning the order
    about so drift on a shared machine hits all alike."""
    loop = asyncio.get_running_loop()
    tag = re.sub(r"[^a-z0-9]+", "-", where.lower()).strip("-")
    started = await start_caches(children, work, origin_url, tag)
    nodes = [server for _, server in started if isinstance(server, Node)]
    # Warm every process's code path and connections on paths outside the measured run.
    async with aiohttp.ClientSession() as s:
        for url in (origin_url, *(cache.url for cache, _ in started)):
            await asyncio.gather(*(get(s, url, path_of(n)) for n in range(p.objects - 64, p.objects)))
    per_round = (p.objects - 64) // rounds

    async def quiet() -> None:
        """Fills committed and the disk's writeback done: a run does not pay for the one before it."""
        for node in nodes:
            await node.settled()
        await loop.run_in_executor(None, os.sync)

    await quiet()
    direct = await wrk(children, origin_url, script(work, f"direct-{tag}", 0, p.objects - 64, wrap=True), p.seconds)
    say(f"  {where}: origin direct: {direct.rps:.0f} req/s ({direct.requests} requests)")
    for r in range(rounds):
        start = r * per_round  # every cache is fresh and its own: each asks the same paths
        for cache, _ in (started if r % 2 == 0 else started[::-1]):
            await quiet()
            before = usage(cache.pids)
            run_ = await cold(children, cache.url, work, start, per_round, p.seconds,
                              f"{cache.name.replace(' ', '-')}-{tag}-{r}")
            after = usage(cache.pids)
            cpu = {pid: after[pid][0] - before[pid][0] for pid in cache.pids}
            waited = sum(after[pid][1] - before[pid][1] for pid in cache.pids) / p.seconds
            cache.rps.append(run_.rps)
            cache.cpu.append(sum(cpu.values()) / max(1, run_.requests))
            cache.waited.append(waited)
            shares = ", ".join(f"{cache.label[pid]} {cpu[pid] / p.seconds:.0%}" for pid in cache.pids
                               if len(cache.pids) > 1 and cpu[pid] / p.seconds >= 0.005)
            say(f"  {where}: round {r}: cold through {cache.name}: {run_.rps:.0f} fills/s ({run_.requests} objects), "
                f"CPU {sum(cpu.values()) / p.seconds:.0%}{f' ({shares})' if shares else ''}, "
                f"{cache.cpu[-1] * 1e6:.0f} CPU us per fill, ready but waiting for a CPU {waited:.0%} of the run")
    for _, server in started:
        assert server.proc is not None
        await children.stop(server.proc)
    return Point(where=where, direct=direct.rps, caches={cache.name: cache.median() for cache, _ in started})


def usage(pids: list[int]) -> dict[int, tuple[float, float]]:
    """Per process: its CPU seconds (/proc/PID/stat), and the seconds its main thread has been ready to run
    and waited for a CPU (/proc/PID/schedstat): on a shared two-core machine, what tells a cache held back by
    the others' load from one that idles."""
    found = {}
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/schedstat") as f:
            queued = int(f.read().split()[1]) / 1e9
        found[pid] = ((int(fields[11]) + int(fields[12])) / TICKS, queued)
    return found


TICKS = os.sysconf("SC_CLK_TCK")


async def curve(children: Children, work: Path, root: Path, p: Plan, rounds: int, rtts: list[float]) -> list[Point]:
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
                points.append(await side_by_side(children, work, f"http://{at}:{port}", p, rounds,
                                                 f"rtt {rtt:g} ms"))
            await children.stop(line)
        assert origin.proc is not None
        await children.stop(origin.proc)
    return points


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    p = plan(args)
    rtts = sorted(set(args.origin_rtt_ms))
    if args.headline_rtt_ms not in rtts:
        raise BenchError(f"--headline-rtt-ms {args.headline_rtt_ms:g} is not among --origin-rtt-ms {rtts}")
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
    loopback = await side_by_side(children, work, origin.url, p, rounds, "loopback")
    points = await curve(children, work, root, p, rounds, rtts)

    say(f"small_files: {time.monotonic() - started:.0f} s so far; code: {source_version()}; nginx: {nginx_version()}; "
        f"load {os.getloadavg()}")
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
    ap.add_argument("--quick", action="store_true", help="fewer objects, shorter runs (about a minute)")
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
