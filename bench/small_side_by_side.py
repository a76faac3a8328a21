"""Cold fills of small objects through caches side by side, by wrk, every path asked once
(bench/small_files.py's docstring says what it measures and why; bench/small_fills_ab.py uses the runs).

Each cache is fresh and its own, so every one asks the same paths; the
rounds turn the order about so drift on a shared machine hits all alike.
Beside fills/s: CPU per fill, the sum over a cache's processes (a node's
workers, nginx's master and workers), and the share of a run those were
ready to run but waited for a CPU (/proc/PID/schedstat), which tells the
others' load on a shared machine from a cache's own limit.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.harness import WRK, BenchError, Children, Nginx, Node, ProxyCache, nginx_conf
from cachenode.cli import worker_count
from cachenode.workers.supervisor import ROLE_ENV
from nezha.wire import CACHE_HEADER

HOST = "images.bench"
CONNECTIONS = 64


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


def path_of(n: int) -> str:
    return f"/d/{n // 1000}/{n}.bin"


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


@dataclass
class Cache:
    """One cache in a side-by-side run, and what its rounds measured."""

    name: str  # "node", "nginx" (one worker each), "node auto", "nginx auto" (as shipped: a worker per CPU)
    url: str
    pids: list[int]  # the processes that serve: the node's one, or its workers; nginx's master and workers
    label: dict[int, str]  # pid -> what it is, for the CPU shares printed ("primary", "follower", ...)
    asked: int = 0  # the paths [0, asked) are this cache's already: its next round starts after them
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


async def start_caches(children: Children, work: Path, origin_url: str, tag: str,
                       python: str = sys.executable) -> list[tuple[Cache, object]]:
    """A fresh nginx `proxy_cache` and a fresh node, each at one worker and as shipped, on 127.0.0.1 of the
    caller's namespace: each cache with its server object; the nodes on `python`."""
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
            # Its workers, and the cache manager and the cache loader (which exits once it has read the zone).
            label = {root.pid: "master", **{k.pid: " ".join(" ".join(k.cmdline()).split()).removeprefix("nginx: ")
                                            .removesuffix(" process")
                                            for k in kids}}
            started.append((Cache(name, proxy.url, [root.pid, *(k.pid for k in kids)], label), proxy))
            continue
        node = Node(children, work, f"{name.replace(' ', '-')}-{tag}", python=python)
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


async def side_by_side(children: Children, work: Path, origin_url: str, objects: int, seconds: int,
                       rounds: int, where: str, python: str = sys.executable) -> Point:
    """Cold fills/s from `origin_url` direct and through each of `CACHES`, fresh, rounds turning the order
    about so drift on a shared machine hits all alike."""
    loop = asyncio.get_running_loop()
    tag = re.sub(r"[^a-z0-9]+", "-", where.lower()).strip("-")
    started = await start_caches(children, work, origin_url, tag, python)
    nodes = [server for _, server in started if isinstance(server, Node)]
    # Warm every process's code path and connections on paths outside the measured run.
    async with aiohttp.ClientSession() as s:
        for url in (origin_url, *(cache.url for cache, _ in started)):
            await asyncio.gather(*(get(s, url, path_of(n)) for n in range(objects - 64, objects)))

    async def quiet() -> None:
        """Fills committed and the disk's writeback done: a run does not pay for the one before it."""
        for node in nodes:
            await node.settled()
        await loop.run_in_executor(None, os.sync)

    await quiet()
    direct = await wrk(children, origin_url, script(work, f"direct-{tag}", 0, objects - 64, wrap=True), seconds)
    say(f"  {where}: origin direct: {direct.rps:.0f} req/s ({direct.requests} requests)")
    for r in range(rounds):
        for cache, _ in (started if r % 2 == 0 else started[::-1]):
            await quiet()
            before = usage(cache.pids)
            # Every cache is fresh and its own: each round asks the paths after the ones it asked before
            # (and the requests wrk left in flight), so a fast cache has the whole dataset for its rounds.
            run_ = await cold(children, cache.url, work, cache.asked, objects - 64 - cache.asked, seconds,
                              f"{cache.name.replace(' ', '-')}-{tag}-{r}")
            after = usage(cache.pids)
            pids = [pid for pid in cache.pids if pid in before and pid in after]  # nginx's cache loader exits
            cpu = {pid: after[pid][0] - before[pid][0] for pid in pids}
            waited = sum(after[pid][1] - before[pid][1] for pid in pids) / seconds
            cache.asked += run_.requests + CONNECTIONS
            cache.rps.append(run_.rps)
            cache.cpu.append(sum(cpu.values()) / max(1, run_.requests))
            cache.waited.append(waited)
            shares = ", ".join(f"{cache.label[pid]} {cpu[pid] / seconds:.0%}" for pid in pids
                               if len(cache.pids) > 1 and cpu[pid] / seconds >= 0.005)
            say(f"  {where}: round {r}: cold through {cache.name}: {run_.rps:.0f} fills/s ({run_.requests} objects), "
                f"CPU {sum(cpu.values()) / seconds:.0%}{f' ({shares})' if shares else ''}, "
                f"{cache.cpu[-1] * 1e6:.0f} CPU us per fill, ready but waiting for a CPU {waited:.0%} of the run")
    for _, server in started:
        assert server.proc is not None
        await children.stop(server.proc)
    return Point(where=where, direct=direct.rps, caches={cache.name: cache.median() for cache, _ in started})


def usage(pids: list[int]) -> dict[int, tuple[float, float, float]]:
    """Per process: its CPU seconds (/proc/PID/stat), the seconds its main thread has been ready to run
    and waited for a CPU (/proc/PID/schedstat): on a shared two-core machine, what tells a cache held back by
    the others' load from one that idles; and the user share of its CPU seconds, which tells the server's own
    code from the kernel's work (system calls, page faults) it asked for."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/schedstat") as f:
                queued = int(f.read().split()[1]) / 1e9
        except FileNotFoundError:
            continue  # gone (nginx's cache loader, once it has loaded): left out of the run it left
        found[pid] = ((int(fields[11]) + int(fields[12])) / TICKS, queued, int(fields[11]) / TICKS)
    return found


TICKS = os.sysconf("SC_CLK_TCK")
