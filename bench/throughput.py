#!/usr/bin/env python3
"""Throughput of one cache node, measured against its origin and against nginx.

One run on this machine measures:

- large object (1 GiB; 256 MiB with --quick), MB/s, median of several runs,
  all with curl writing to /dev/null:
  direct from the local origin; cold through the cache (origin not
  throttled: the node's fill path); warm through the cache; warm through
  nginx `proxy_cache` (Debian's nginx, configured here, the same origin);
- small objects (200 distinct 100 KiB files, 32 concurrent connections),
  requests/s with wrk and a Lua script that round-robins the paths and sets
  the Host header: the same command against the cache and nginx, both warm
  (every object is checked to be a hit first), and the origin for context;
- range_small: 1 MiB ranges of the warm large object (`Range: bytes=a-b`,
  what multipart downloaders send), 32 connections with wrk and a Lua
  script that walks the object's offsets: the cache's req/s ÷ nginx's
  (proxy_cache answers ranges of a cached object itself), with `--workers`
  processes each (`range_small_wN` for N above 1). `--range-only` runs
  just this case (the large object warm in both first): a minute, not ten;
- the cold ratio: cold through the cache / direct, both from the origin
  throttled per connection (--rate, 20 MB/s by default) - what a training
  job sees the first time, where the node must add nothing;
- cold_parallel: a cold fill from an origin throttled per connection that
  answers Range (as S3 and GCS do; 256 MiB, 128 with --quick) ÷ one direct
  stream from it: the parallel range fill (docs/cache-node.md); and
  parallel_origin_bytes, what that fill cost the origin against the
  object, and origin_overhead, the same for one fill of a fresh name that
  fifty concurrent cold clients wait on (no range is cut since issue 26;
  what is left is the first answer, closed unread);
- cold_fast: the cold fill from the unthrottled origin ÷ direct, and the
  node's CPU seconds per GiB it filled; cold_fast_nginx, the same cold
  fill through nginx proxy_cache ÷ direct, is its reference: what a C
  cache writing the same disk reaches on this machine; cold_fast_bare,
  the same cold fill through bench/bare_relay.py (splice to a file on a
  thread, sendfile from it; no HTTP framework, no store) ÷ direct, is
  the ceiling for any cache that writes what it serves. Every run that
  writes a large object starts after os.sync() and after writing and
  deleting twice its size (settle_disk), so none pays for the previous
  one's writeback or for this VM's first touch of a page;
- peer_copy: a second node copies the large object from the first one's
  disk (POST /_nezha/replicate, as a replica does after a fill), MB/s ÷
  warm large through the cache (sendfile);
- the node's peak RSS (its process tree, psutil, every 50 ms) during the
  cold fills and the warm large transfers;
- fill_verify: a cold fill of the large object from the unthrottled origin
  publishing its sha256 (`x-amz-checksum-sha256`, which the node checks as
  the bytes land: docs/cache-node.md, "Verified bytes") ÷ the same fill
  with no digest published, on a node of its own, runs alternating (the
  median of each); fill_verify_crc64nvme the same with S3's default
  checksum. First, one fill under a wrong sha256 must be cut short: the
  check is on. `--fill-verify-only` runs just this, and the same from the
  throttled origin that answers ranges (fill_verify_ranged: a parallel
  fill at the network's pace, --rate per connection).
- verify_large, verify_small (`--verify-reads-only`): warm throughput of a
  node with --verify-reads ÷ the same node without, on one origin, runs
  alternating (curl of the large object, wrk over the small ones). The
  issue's rule: --verify-reads is on by default only if both are >= 0.9.

Equal CPU: nginx gets as many worker processes as the cache node runs
(`--workers N`, default 1: the node's `--workers`, counted from its process
tree), sendfile on, access log off. With N above 1 the small objects are
also served by a one-worker node and a one-worker nginx, in rounds that
alternate with the N-worker node: `small` is then the one-worker ratio,
`small_wN` the N-worker one, and `scale_small` the N-worker node's rate over
the one-worker node's, with the CPU wrk itself used beside it (on two cores
the load generator takes part of what the workers could use).
Cache and nginx runs alternate so that drift on a shared machine hits both.

The last line is machine-readable:

    ratios: large=<cache/nginx MB/s> small=<cache/nginx req/s> cold=<cold/direct> rss_mb=<peak>
            cold_fast=<cold/direct, fast origin> cold_parallel=<cold/one stream, ranged origin>
            parallel_origin_bytes=<bytes the ranged origin sent for the parallel fill / object size>
            origin_overhead=<the same, for one fill that fifty concurrent cold clients wait on>
            fill_cpu_s_per_gib=<node CPU seconds per GiB of a fast cold fill>
            peer_copy=<a replica's copy between two nodes MB/s / warm large through the cache>
            cold_fast_nginx=<nginx proxy_cache cold / direct, fast origin>
            cold_fast_bare=<bench/bare_relay.py cold / direct, fast origin>
            and with --workers N above 1: small_wN=<cache/nginx req/s, N workers each>
            scale_small=<node req/s with N workers / with 1> wrk_cores=<CPU wrk used>
            range_small=<cache/nginx req/s, 1 MiB ranges; range_small_wN with N workers each>
            range_cpu_us=<the node's CPU microseconds per 1 MiB range>
            fill_verify=<cold fill with a sha256 checked / without a digest, fast origin>
            fill_verify_crc64nvme=<the same, with a crc64nvme checked>
            (--fill-verify-only: also fill_verify_ranged, from the throttled origin that answers ranges)
            (--verify-reads-only: verify_large=<warm large MB/s checked / plain> verify_small=<the same, req/s>)

Everything listens on 127.0.0.1. Children run in their own sessions with a
parent-death signal, and a `finally` stops them and removes the temp dir,
also on Ctrl-C and SIGTERM. Needs curl, wrk and nginx (installed with
apt-get when running as root) and psutil.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402
from awscrt import checksums  # noqa: E402

from bench.harness import (CURL, NGINX, WRK, BenchError, Children, KiB, MiB, Nginx, Node, ProxyCache,  # noqa: E402
                           Sampler, ensure_tool, nginx_conf, nginx_version, source_version, write_random)
from nezha.dev.origin import LocalOrigin  # noqa: E402
from nezha.wire import CACHE_HEADER, REPLICATE_PATH, CacheOutcome, ReplicateResult  # noqa: E402
from testkit.ports import free_port  # noqa: E402

HOST = "bench.nezha.test"  # the origin as clients name it; fast upstream
SLOW_HOST = "slow.nezha.test"  # the same folder, throttled per connection
FIFTY = 50  # concurrent cold clients of one parallel fill, for origin_overhead
RANGED_HOST = "ranged.nezha.test"  # throttled per connection too, and answering Range (as S3, GCS do)


@dataclass(frozen=True)
class Plan:
    """Sizes and repetitions of one run (--quick or full)."""

    large_bytes: int
    runs: int  # curl runs per large measurement
    small_count: int
    small_bytes: int
    connections: int
    wrk_seconds: int
    wrk_runs: int  # per server
    cold_bytes: int | None  # None: the large object itself
    cold_runs: int
    rate: float
    parallel_bytes: int


def plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        large_bytes=args.large_bytes or (256 * MiB if quick else 1024 * MiB),
        runs=args.runs or (3 if quick else 7),
        small_count=200,
        small_bytes=100 * KiB,
        connections=args.connections,
        wrk_seconds=args.wrk_seconds or (5 if quick else 10),
        wrk_runs=1 if quick else 3,
        cold_bytes=64 * MiB if quick else None,
        cold_runs=2 if quick else 1,
        rate=args.rate,
        parallel_bytes=128 * MiB if quick else 256 * MiB,
    )


# -- data --------------------------------------------------------------------------

@dataclass
class Dataset:
    root: Path
    large: str  # URL path
    large_bytes: int
    large_sha256: str
    small: list[str]
    cold: list[str]  # distinct names, each fetched cold once through the cache
    cold_direct: str
    cold_bytes: int
    profile_cold: list[str]  # fresh names of the large object, for a profiled cold fill
    parallel_direct: str  # one object under two names: fetched directly, and cold through the cache
    parallel_cold: str
    parallel_fifty: str  # the same bytes again, filled cold for FIFTY clients at once
    parallel_bytes: int
    parallel_sha256: str


def make_dataset(root: Path, p: Plan) -> Dataset:
    large_sha = write_random(root / "large.bin", p.large_bytes)
    (root / "small").mkdir()
    small = []
    for i in range(p.small_count):
        name = f"small/s{i:03d}.bin"
        (root / name).write_bytes(os.urandom(p.small_bytes))
        small.append("/" + name)
    # Cold runs need fresh cache keys for the same bytes: hard links cost no disk.
    if p.cold_bytes is None:
        base, cold_bytes = root / "large.bin", p.large_bytes
    else:
        base, cold_bytes = root / "cold-base.bin", p.cold_bytes
        write_random(base, cold_bytes)
    (root / "cold").mkdir()
    cold = []
    for i in range(p.cold_runs):
        os.link(base, root / "cold" / f"c{i}.bin")
        cold.append(f"/cold/c{i}.bin")
    os.link(root / "large.bin", root / "cold" / "profile.bin")
    parallel_sha = write_random(root / "par" / "direct.bin", p.parallel_bytes)
    os.link(root / "par" / "direct.bin", root / "par" / "cold.bin")
    os.link(root / "par" / "direct.bin", root / "par" / "fifty.bin")
    return Dataset(root=root, large="/large.bin", large_bytes=p.large_bytes, large_sha256=large_sha,
                   small=small, cold=cold, cold_direct="/" + base.name, cold_bytes=cold_bytes,
                   profile_cold=["/cold/profile.bin"], parallel_direct="/par/direct.bin",
                   parallel_cold="/par/cold.bin", parallel_fifty="/par/fifty.bin", parallel_bytes=p.parallel_bytes, parallel_sha256=parallel_sha)


# -- clients -------------------------------------------------------------------------

@dataclass
class Transfer:
    status: int
    nbytes: int
    seconds: float
    headers: dict[str, str]

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6


async def curl(children: Children, url: str, *, host: str, expect_bytes: int, timeout: float = 900) -> Transfer:
    """One GET with curl to /dev/null; headers on stdout, then the -w line."""
    out = await children.run(
        CURL, "-s", "-S", "-o", "/dev/null", "-D", "-", "-H", f"Host: {host}",
        "-w", "\nCURLW %{http_code} %{size_download} %{time_total}\n", url, timeout=timeout)
    head, _, tail = out.rpartition("CURLW ")
    code, size, secs = tail.split()
    headers = {}
    for line in head.splitlines()[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    t = Transfer(status=int(code), nbytes=int(size), seconds=float(secs), headers=headers)
    if t.status != 200 or t.nbytes != expect_bytes:
        raise BenchError(f"GET {url} (Host {host}) answered {t.status} with {t.nbytes} bytes, "
                         f"expected 200 with {expect_bytes}")
    return t


async def curl_sha256(children: Children, url: str, *, host: str) -> str:
    """SHA-256 of a body as curl receives it (a correctness check, not timed)."""
    proc = await children.spawn(CURL, "-s", "-S", "-f", "-H", f"Host: {host}", url,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    digest = hashlib.sha256()
    while chunk := await proc.stdout.read(4 * MiB):
        digest.update(chunk)
    err = await proc.stderr.read()
    # Let asyncio reap it: signalling an exited child races with its watcher.
    if await proc.wait() != 0:
        raise BenchError(f"curl {url} exited {proc.returncode}: {err.decode(errors='replace')[-300:]}")
    await children.stop(proc)
    return digest.hexdigest()


WRK_LUA = """\
-- Round-robin over the objects; each wrk thread starts at its own offset.
local paths = {%(paths)s}
local i = 0
local threads = 0
function setup(thread)
  thread:set("offset", threads * 37)
  threads = threads + 1
end
function init(args)
  i = (offset or 0) %% #paths
end
wrk.headers["Host"] = "%(host)s"
function request()
  i = i %% #paths + 1
  return wrk.format("GET", paths[i])
end
"""


RANGE_LUA = """\
-- One object read in ranges of `span` bytes, as multipart downloaders read it:
-- each request the next whole span, with a stride coprime to the count of
-- spans (a power of two), so every offset comes round; threads start apart.
local span = %(span)d
local count = %(count)d
local i = 0
local threads = 0
function setup(thread)
  thread:set("offset", threads * 61)
  threads = threads + 1
end
function init(args)
  i = (offset or 0) %% count
end
function request()
  i = (i + 97) %% count
  local first = i * span
  return wrk.format("GET", "%(path)s", {["Host"] = "%(host)s",
                                         ["Range"] = "bytes=" .. first .. "-" .. (first + span - 1)})
end
"""
RANGE_SPAN = MiB


@dataclass
class WrkResult:
    rps: float
    requests: int
    p50_ms: float | None
    p99_ms: float | None
    errors: str | None

    @staticmethod
    def parse(out: str) -> "WrkResult":
        m = re.search(r"Requests/sec:\s+([\d.]+)", out)
        n = re.search(r"(\d+) requests in", out)
        if not m or not n:
            raise BenchError(f"cannot read wrk output:\n{out}")
        bad = []
        if (e := re.search(r"Non-2xx or 3xx responses: (\d+)", out)):
            bad.append(f"{e.group(1)} non-2xx")
        if (e := re.search(r"Socket errors: (.*)", out)):
            bad.append(f"socket errors {e.group(1)}")
        return WrkResult(rps=float(m.group(1)), requests=int(n.group(1)),
                         p50_ms=_latency(out, "50%"), p99_ms=_latency(out, "99%"),
                         errors="; ".join(bad) or None)


def _latency(out: str, pct: str) -> float | None:
    m = re.search(rf"^\s*{re.escape(pct)}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    if not m:
        return None
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


async def wrk(children: Children, url: str, script: Path, *, p: Plan) -> WrkResult:
    out = await children.run(
        WRK, "-t2", f"-c{p.connections}", f"-d{p.wrk_seconds}s", "--timeout", "10s", "--latency",
        "-s", str(script), url, timeout=p.wrk_seconds + 60)
    result = WrkResult.parse(out)
    if result.errors:
        raise BenchError(f"wrk against {url} saw errors ({result.errors}); figures would be meaningless")
    return result


# -- servers ---------------------------------------------------------------------------



def proxy_conf(upstream: str, workers: int) -> str:
    """nginx proxy_cache in front of the local origin, `workers` processes (as many as the node's)."""
    return nginx_conf(ProxyCache(upstream=upstream), by="bench/throughput.py", workers=workers)


class BareRelay:
    """bench/bare_relay.py: the least a cold fill costs here (its docstring says why)."""

    def __init__(self, children: Children, work: Path) -> None:
        self.children = children
        self.dir = work / "bare"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self, *, upstream: str) -> None:
        self.dir.mkdir()
        self.proc = await self.children.spawn(
            sys.executable, str(REPO / "bench" / "bare_relay.py"), "--listen", f"127.0.0.1:{self.port}",
            "--upstream", upstream.removeprefix("http://"), "--dir", str(self.dir),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 15)
        except asyncio.TimeoutError:
            line = b""
        if line.strip() != b"listening":
            raise BenchError(f"bench/bare_relay.py did not start (said {line!r}, exit {self.proc.returncode})")


# -- the run -------------------------------------------------------------------------

@dataclass
class Results:
    rows: list[tuple[str, str, float | None, str]] = field(default_factory=list)

    def add(self, what: str, figure: str, cpu: float | None, note: str = "") -> None:
        self.rows.append((what, figure, cpu, note))
        say(f"  {what}: {figure}  {note}".rstrip())

    def table(self) -> list[str]:
        w = max(len(r[0]) for r in self.rows)
        fw = max(len(r[1]) for r in self.rows)
        lines = [f"  {'measurement':<{w}}  {'result':>{fw}}  {'server cpu':>10}  runs / notes"]
        for what, figure, cpu, note in self.rows:
            c = "" if cpu is None else f"{cpu:.0f}%"
            lines.append(f"  {what:<{w}}  {figure:>{fw}}  {c:>10}  {note}".rstrip())
        return lines


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def median_mbps(transfers: list[Transfer]) -> float:
    return statistics.median(t.mbps for t in transfers)


def spread(transfers: list[Transfer]) -> str:
    xs = sorted(t.mbps for t in transfers)
    return f"runs {', '.join(f'{x:.0f}' for x in xs)}"


def expect_header(t: Transfer, name: str, want: str, *, what: str) -> None:
    got = t.headers.get(name.lower())
    if got != want:
        raise BenchError(f"{what}: expected {name}: {want}, got {got!r}")


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    p = plan(args)
    mode = "quick" if args.quick else "full"
    say(f"nezha bench ({mode}): {os.cpu_count()} CPUs, work dir {work}")
    loop = asyncio.get_running_loop()
    started = time.monotonic()

    say(f"making data: {p.large_bytes / MiB:.0f} MiB large object, {p.small_count} x {p.small_bytes // KiB} KiB ...")
    data = await loop.run_in_executor(None, make_dataset, work / "origin", p)

    fast = LocalOrigin(data.root)
    slow = LocalOrigin(data.root, rate=p.rate)
    ranged = LocalOrigin(data.root, rate=p.rate, ranges=True)
    fast_url = await fast.start()
    slow_url = await slow.start()
    ranged_url = await ranged.start()
    try:
        node = Node(children, work)
        await node.start(origins={HOST: fast_url, SLOW_HOST: slow_url, RANGED_HOST: ranged_url},
                         args=["--workers", str(args.workers)] if args.workers > 1 else [])
        await node.serving_workers(args.workers)
        workers = node.workers()
        nginx = Nginx(children, work)
        await nginx.start(proxy_conf(fast_url, workers))
        assert node.proc is not None and nginx.proc is not None
        node_pid, nginx_pid = node.proc.pid, nginx.proc.pid
        res = Results()
        rss: dict[str, int] = {}
        say(f"origin {fast_url} (throttled twin {slow_url}), cache node {node.url} ({workers} process), "
            f"nginx {nginx.url} (worker_processes {workers})")
        with Sampler(node_pid) as idle:
            await asyncio.sleep(0.2)
        rss["idle"] = idle.peak

        # -- large object -------------------------------------------------------
        size = data.large_bytes
        say(f"large object, {size / MiB:.0f} MiB, curl, {p.runs} runs each:")
        direct = [await curl(children, fast_url + data.large, host=HOST, expect_bytes=size) for _ in range(p.runs)]
        res.add("large direct from origin", f"{median_mbps(direct):.0f} MB/s", None, spread(direct))

        await settle_disk(work, size)
        with Sampler(node_pid) as s:
            cold = await curl(children, node.url + data.large, host=HOST, expect_bytes=size)
            await node.settled()
        expect_header(cold, CACHE_HEADER, CacheOutcome.MISS, what="first large GET through the cache")
        rss["cold_fill_fast"] = s.peak
        fill_cpu = s.per_gib(size)
        res.add("large cold through cache (origin not throttled)", f"{cold.mbps:.0f} MB/s", s.cpu_percent,
                f"1 run; node {fill_cpu:.2f} CPU s per GiB filled")

        await settle_disk(work, size)
        with Sampler(nginx_pid) as s:
            prime = await curl(children, nginx.url + data.large, host=HOST, expect_bytes=size)
        expect_header(prime, "X-Nginx-Cache", "MISS", what="first large GET through nginx")
        res.add("large cold through nginx proxy_cache", f"{prime.mbps:.0f} MB/s", s.cpu_percent,
                f"1 run; nginx {s.per_gib(size):.2f} CPU s per GiB filled")

        bare = BareRelay(children, work)
        await bare.start(upstream=fast_url)
        await settle_disk(work, size)
        with Sampler(bare.proc.pid) as s:
            floor = await curl(children, bare.url + data.large, host=HOST, expect_bytes=size)
        res.add("large cold through a bare relay (bench/bare_relay.py)", f"{floor.mbps:.0f} MB/s", s.cpu_percent,
                f"1 run; {s.per_gib(size):.2f} CPU s per GiB: splice to a file, sendfile from it")
        await children.stop(bare.proc)

        warm_cache: list[Transfer] = []
        warm_nginx: list[Transfer] = []
        cpu_cache: list[float] = []
        cpu_nginx: list[float] = []
        rss["warm_large"] = 0
        for _ in range(p.runs):  # alternate, so drift on a shared machine hits both alike
            with Sampler(node_pid) as s:
                t = await curl(children, node.url + data.large, host=HOST, expect_bytes=size)
            expect_header(t, CACHE_HEADER, CacheOutcome.HIT, what="warm large GET through the cache")
            warm_cache.append(t)
            cpu_cache.append(s.cpu_percent)
            rss["warm_large"] = max(rss["warm_large"], s.peak)
            with Sampler(nginx_pid) as s:
                t = await curl(children, nginx.url + data.large, host=HOST, expect_bytes=size)
            expect_header(t, "X-Nginx-Cache", "HIT", what="warm large GET through nginx")
            warm_nginx.append(t)
            cpu_nginx.append(s.cpu_percent)
        res.add("large warm through cache", f"{median_mbps(warm_cache):.0f} MB/s", statistics.median(cpu_cache),
                spread(warm_cache))
        res.add("large warm through nginx proxy_cache", f"{median_mbps(warm_nginx):.0f} MB/s",
                statistics.median(cpu_nginx), spread(warm_nginx))
        pairs = sorted(c.mbps / n.mbps for c, n in zip(warm_cache, warm_nginx))
        say(f"  cache/nginx run by run (adjacent runs): {', '.join(f'{x:.2f}' for x in pairs)}")

        for name, url in (("cache", node.url), ("nginx", nginx.url)):
            digest = await curl_sha256(children, url + data.large, host=HOST)
            if digest != data.large_sha256:
                raise BenchError(f"large object through {name}: sha256 {digest[:16]}... "
                                 f"!= origin {data.large_sha256[:16]}...")

        # -- peer copy: a replica's copy of the large object from the node's disk --------
        peer = Node(children, work, name="peer")
        await peer.start(origins={HOST: fast_url, SLOW_HOST: slow_url, RANGED_HOST: ranged_url})
        await settle_disk(work, size)
        copy_mbps = await replicate(peer, source=node, path=data.large, size=size)
        res.add("large copied node to node (replicate)", f"{copy_mbps:.0f} MB/s", None,
                f"1 run; POST {REPLICATE_PATH} to a second node, from the first one's disk")
        assert peer.proc is not None
        await children.stop(peer.proc)

        # -- small objects --------------------------------------------------------
        script = work / "paths.lua"
        script.write_text(WRK_LUA % {"paths": ", ".join(f'"{s}"' for s in data.small), "host": HOST})
        say(f"small objects, {len(data.small)} x {p.small_bytes // KiB} KiB, wrk -t2 -c{p.connections}, "
            f"{p.wrk_seconds}s x {p.wrk_runs} each:")
        await prime_small(node.url, nginx.url, data.small)
        await node.settled()
        await check_small_hits(node.url, nginx.url, data.small)

        origin_rps = await wrk(children, fast_url + "/", script, p=p)
        res.add("small direct from origin (aiohttp FileResponse)", f"{origin_rps.rps:.0f} req/s", None,
                _wrk_note([origin_rps]))
        small_cache: list[WrkResult] = []
        small_nginx: list[WrkResult] = []
        cpu_cache, cpu_nginx = [], []
        rss["small"] = 0
        for _ in range(p.wrk_runs):
            before = await node.counters()
            with Sampler(node_pid) as s:
                small_cache.append(await wrk(children, node.url + "/", script, p=p))
            after = await node.counters()
            if after["nezha_cache_misses_total"] != before["nezha_cache_misses_total"]:
                raise BenchError("the cache node missed during the warm small-object run")
            cpu_cache.append(s.cpu_percent)
            rss["small"] = max(rss["small"], s.peak)
            with Sampler(nginx_pid) as s:
                small_nginx.append(await wrk(children, nginx.url + "/", script, p=p))
            cpu_nginx.append(s.cpu_percent)
        cache_rps = statistics.median(r.rps for r in small_cache)
        nginx_rps = statistics.median(r.rps for r in small_nginx)
        res.add("small warm through cache", f"{cache_rps:.0f} req/s", statistics.median(cpu_cache),
                _wrk_note(small_cache))
        res.add("small warm through nginx proxy_cache", f"{nginx_rps:.0f} req/s", statistics.median(cpu_nginx),
                _wrk_note(small_nginx))
        one = None
        if workers > 1:
            one = await small_one_worker_each(children, work, p=p, script=script, node=node, fast_url=fast_url,
                                              paths=data.small, res=res)
        ranges = await range_small(children, work, p=p, node=node, nginx=nginx, data=data, res=res)

        # -- cold, throttled origin -----------------------------------------------------
        say(f"cold ratio: origin throttled to {p.rate / 1e6:g} MB/s per connection, "
            f"{data.cold_bytes / MiB:.0f} MiB, {p.cold_runs} run(s) each:")
        cold_direct: list[Transfer] = []
        cold_cache: list[Transfer] = []
        with Sampler(node_pid) as s:
            for path in data.cold:
                cold_direct.append(await curl(children, slow_url + data.cold_direct, host=SLOW_HOST,
                                              expect_bytes=data.cold_bytes))
                t = await curl(children, node.url + path, host=SLOW_HOST, expect_bytes=data.cold_bytes)
                expect_header(t, CACHE_HEADER, CacheOutcome.MISS, what=f"cold GET of {path}")
                cold_cache.append(t)
            await node.settled()
        rss["cold_fill_throttled"] = s.peak
        res.add("throttled direct from origin", f"{median_mbps(cold_direct):.2f} MB/s", None, spread_fine(cold_direct))
        res.add("throttled cold through cache", f"{median_mbps(cold_cache):.2f} MB/s", None, spread_fine(cold_cache))

        # -- cold, throttled origin that answers ranges: parallel fills ---------------------
        say(f"cold parallel: origin throttled to {p.rate / 1e6:g} MB/s per connection, answering Range, "
            f"{data.parallel_bytes / MiB:.0f} MiB:")
        par_direct = await curl(children, ranged_url + data.parallel_direct, host=RANGED_HOST,
                                expect_bytes=data.parallel_bytes)
        sent_before = ranged.sent
        with Sampler(node_pid) as s:
            par_cold = await curl(children, node.url + data.parallel_cold, host=RANGED_HOST,
                                  expect_bytes=data.parallel_bytes)
            await node.settled()
        # What the parallel fill cost the origin, against the object: ranges
        # cut when their back halves are stolen close with data in flight.
        parallel_origin_bytes = (ranged.sent - sent_before) / data.parallel_bytes
        expect_header(par_cold, CACHE_HEADER, CacheOutcome.MISS, what="cold GET from the ranged origin")
        rss["cold_fill_parallel"] = s.peak
        digest = await curl_sha256(children, node.url + data.parallel_cold, host=RANGED_HOST)
        if digest != data.parallel_sha256:
            raise BenchError(f"parallel fill: sha256 {digest[:16]}... != origin {data.parallel_sha256[:16]}...")
        # origin_overhead: what one parallel fill for FIFTY concurrent cold
        # clients cost the origin, against the object (issue 26: <= 1.01).
        sent_before = ranged.sent
        fifty = await asyncio.gather(*(curl(children, node.url + data.parallel_fifty, host=RANGED_HOST,
                                            expect_bytes=data.parallel_bytes) for _ in range(FIFTY)))
        await node.settled()
        origin_overhead = (ranged.sent - sent_before) / data.parallel_bytes
        outcomes = sorted(t.headers.get(CACHE_HEADER.lower()) or "-" for t in fifty)
        if outcomes != sorted([CacheOutcome.MISS] + [CacheOutcome.MISS_JOINED] * (FIFTY - 1)):
            raise BenchError(f"{FIFTY} cold GETs of one object: expected one miss and the rest miss-joined, "
                             f"got {outcomes}")
        res.add("ranged origin, direct (one stream)", f"{par_direct.mbps:.2f} MB/s", None, "1 run")
        res.add("ranged origin, cold through cache (parallel)", f"{par_cold.mbps:.2f} MB/s", s.cpu_percent,
                f"1 run; {ranged.gets} GETs at the origin")

        verify = await fill_verify(children, work, p=p, data=data, res=res)

        if args.profile:
            await profile_node(args.profile, children, node=node, data=data, script=script, p=p)
    finally:
        await children.stop_all()  # clients first, so no origin handler sees a reset
        await fast.stop()
        await slow.stop()
        await ranged.stop()

    large_ratio = median_mbps(warm_cache) / median_mbps(warm_nginx)
    small_ratio = cache_rps / nginx_rps  # with `workers` each
    small_w1 = small_ratio if one is None else one.node_rps / one.nginx_rps
    range_name, range_ratio = range_key(workers), ranges[0] / ranges[1]
    cold_ratio = median_mbps(cold_cache) / median_mbps(cold_direct)
    cold_fast = cold.mbps / median_mbps(direct)
    cold_fast_nginx = prime.mbps / median_mbps(direct)
    cold_fast_bare = floor.mbps / median_mbps(direct)
    cold_parallel = par_cold.mbps / par_direct.mbps
    peer_copy = copy_mbps / median_mbps(warm_cache)
    peak = max(rss["cold_fill_fast"], rss["warm_large"], rss["cold_fill_throttled"], rss["cold_fill_parallel"])
    elapsed = time.monotonic() - started

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = [
        "",
        f"Cache node throughput ({mode}; {os.cpu_count()} CPUs; cache node {workers} process, "
        f"nginx worker_processes {workers}; {elapsed:.0f}s)",
        f"  code: {source_version()}; nginx: {nginx_version()}",
        "",
        *res.table(),
        "",
        f"  large cache/nginx run by run (adjacent runs): {', '.join(f'{x:.2f}' for x in pairs)}",
        "  server cpu: CPU time of the serving process tree / wall time (100% = one core)",
        "  cache node peak RSS (process tree, sampled every 50 ms):",
        f"    idle {rss['idle'] / MiB:.1f} MiB; cold fill (fast origin) {rss['cold_fill_fast'] / MiB:.1f} MiB; "
        f"warm large {rss['warm_large'] / MiB:.1f} MiB; cold fill (throttled) "
        f"{rss['cold_fill_throttled'] / MiB:.1f} MiB; cold fill (parallel) {rss['cold_fill_parallel'] / MiB:.1f} MiB; "
        f"small {rss['small'] / MiB:.1f} MiB",
        "",
        f"  large  warm cache / warm nginx       {large_ratio:6.3f}  target >= 0.9   {verdict(large_ratio >= 0.9)}",
        f"  small  warm cache / warm nginx, 1 worker each {small_w1:6.3f}  target >= 0.9   "
        f"{verdict(small_w1 >= 0.9)}",
        *([] if one is None else [
            f"  small_w{workers} warm cache / warm nginx, {workers} workers each {small_ratio:6.3f}  target >= 0.9   "
            f"{verdict(small_ratio >= 0.9)}",
            f"  scale_small node {workers} workers / 1 worker  {one.scale:6.3f}  target >= 1.3   "
            f"{verdict(one.scale >= 1.3)}  (wrk itself used {one.wrk_cores:.2f} of {os.cpu_count()} cores)"]),
        f"  {range_name} 1 MiB ranges, cache / nginx, {workers} worker(s) each {range_ratio:6.3f}",
        f"  cold   cold cache / direct, throttled {cold_ratio:6.3f}  target >= 0.95  {verdict(cold_ratio >= 0.95)}",
        f"  cold_fast cold cache / direct, fast  {cold_fast:6.3f}  target >= 0.7   {verdict(cold_fast >= 0.7)}",
        f"  cold_fast_nginx nginx cold / direct  {cold_fast_nginx:6.3f}  (reference: the same cold fill through nginx)",
        f"  cold_fast_bare bare relay / direct   {cold_fast_bare:6.3f}  (reference: write once, send from the file)",
        f"  cold_parallel cold / one stream      {cold_parallel:6.3f}  target >= 4.0   {verdict(cold_parallel >= 4.0)}",
        f"  parallel_origin_bytes origin / object {parallel_origin_bytes:6.3f}  target < 1.08  "
        f"{verdict(parallel_origin_bytes < 1.08)}",
        f"  origin_overhead origin / object ({FIFTY} clients) {origin_overhead:6.3f}  target <= 1.01  "
        f"{verdict(origin_overhead <= 1.01)}",
        f"  peer_copy copy / warm sendfile       {peer_copy:6.3f}  target >= 0.5   {verdict(peer_copy >= 0.5)}",
        f"  fill_verify sha256 checked / none     {verify['sha256']:6.3f}  target >= 0.95  "
        f"{verdict(verify['sha256'] >= 0.95)}  (crc64nvme: {verify['crc64nvme']:.3f})",
        f"  rss_mb peak (cold fills, warm large) {peak / MiB:6.1f}  target < {150 * max(1, args.workers)}    "
        f"{verdict(peak / MiB < 150 * max(1, args.workers))}"
        + ("" if args.workers == 1 else f"  (process tree: {args.workers} workers and their supervisor)"),
        f"ratios: large={large_ratio:.3f} small={small_w1:.3f} cold={cold_ratio:.3f} rss_mb={peak / MiB:.1f} "
        f"cold_fast={cold_fast:.3f} cold_parallel={cold_parallel:.3f} fill_cpu_s_per_gib={fill_cpu:.2f} "
        f"peer_copy={peer_copy:.3f} cold_fast_nginx={cold_fast_nginx:.3f} cold_fast_bare={cold_fast_bare:.3f} "
        f"parallel_origin_bytes={parallel_origin_bytes:.3f} origin_overhead={origin_overhead:.3f} "
        f"{range_name}={range_ratio:.3f} range_cpu_us={ranges[2]:.0f} "
        f"fill_verify={verify['sha256']:.3f} fill_verify_crc64nvme={verify['crc64nvme']:.3f}"
        + ("" if one is None else f" small_w{workers}={small_ratio:.3f} scale_small={one.scale:.3f} "
                                  f"wrk_cores={one.wrk_cores:.2f}"),
    ]
    return "\n".join(lines)


def range_key(workers: int) -> str:
    return "range_small" if workers == 1 else f"range_small_w{workers}"


async def range_small(children: Children, work: Path, *, p: Plan, node: Node, nginx: Nginx, data: Dataset,
                      res: Results) -> tuple[float, float, float]:
    """1 MiB ranges of the warm large object, through the node and through
    nginx in alternating wrk runs: (node req/s, nginx req/s, node CPU
    microseconds per range), medians.
    Both must answer a range with a 206 of the right bytes from their cache
    first, and the node must miss nothing meanwhile."""
    count = data.large_bytes // RANGE_SPAN
    if count < 2:
        raise BenchError(f"range_small needs a large object of 2 MiB at least, not {data.large_bytes} bytes")
    script = work / "ranges.lua"
    script.write_text(RANGE_LUA % {"span": RANGE_SPAN, "count": count, "path": data.large, "host": HOST})
    first = (count // 2) * RANGE_SPAN
    with open(data.root / data.large.lstrip("/"), "rb") as f:
        f.seek(first)
        want = hashlib.sha256(f.read(RANGE_SPAN)).hexdigest()
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        for base, header, warm in ((node.url, CACHE_HEADER, CacheOutcome.HIT), (nginx.url, "X-Nginx-Cache", "HIT")):
            rng = f"bytes={first}-{first + RANGE_SPAN - 1}"
            async with s.get(base + data.large, headers={"Host": HOST, "Range": rng}) as r:
                got = hashlib.sha256(await r.read()).hexdigest()
                if r.status != 206 or got != want or r.headers.get(header) != warm:
                    raise BenchError(f"{base}: Range {rng} got {r.status}, {header}: {r.headers.get(header)!r}, "
                                     f"sha256 {'right' if got == want else 'wrong'}")
    say(f"1 MiB ranges of the {data.large_bytes / MiB:.0f} MiB object, wrk -t2 -c{p.connections}, "
        f"{p.wrk_seconds}s x {p.wrk_runs} each:")
    assert node.proc is not None and nginx.proc is not None
    cache, ref, cpu_cache, cpu_nginx = [], [], [], []
    for _ in range(p.wrk_runs):
        before = await node.counters()
        with Sampler(node.proc.pid) as s1:
            cache.append(await wrk(children, node.url + "/", script, p=p))
        after = await node.counters()
        if after["nezha_cache_misses_total"] != before["nezha_cache_misses_total"]:
            raise BenchError("the cache node missed during the ranged run")
        cpu_cache.append(s1.cpu_percent)
        with Sampler(nginx.proc.pid) as s2:
            ref.append(await wrk(children, nginx.url + "/", script, p=p))
        cpu_nginx.append(s2.cpu_percent)
    node_rps, nginx_rps = statistics.median(r.rps for r in cache), statistics.median(r.rps for r in ref)
    # CPU per range: what a loaded machine's noise in req/s does not hide (wrk reading the bodies is the
    # bottleneck on two cores, not the server).
    node_us = statistics.median(c / 100 / r.rps * 1e6 for c, r in zip(cpu_cache, cache))
    nginx_us = statistics.median(c / 100 / r.rps * 1e6 for c, r in zip(cpu_nginx, ref))
    res.add("1 MiB ranges through cache", f"{node_rps:.0f} req/s", statistics.median(cpu_cache),
            f"{_wrk_note(cache)}; {node_us:.0f} us CPU per range")
    res.add("1 MiB ranges through nginx proxy_cache", f"{nginx_rps:.0f} req/s", statistics.median(cpu_nginx),
            f"{_wrk_note(ref)}; {nginx_us:.0f} us CPU per range")
    return node_rps, nginx_rps, node_us


async def run_range_only(args: argparse.Namespace, work: Path, children: Children) -> str:
    """`--range-only`: the large object, warm in the node and in nginx, read in 1 MiB ranges."""
    p = plan(args)
    started = time.monotonic()
    root = work / "origin"
    say(f"range_small only: {p.large_bytes / MiB:.0f} MiB object, {os.cpu_count()} CPUs, work dir {work}")
    sha = await asyncio.get_running_loop().run_in_executor(None, write_random, root / "large.bin", p.large_bytes)
    data = Dataset(root=root, large="/large.bin", large_bytes=p.large_bytes, large_sha256=sha, small=[], cold=[],
                   cold_direct="", cold_bytes=0, profile_cold=[], parallel_direct="", parallel_cold="",
                   parallel_fifty="", parallel_bytes=0, parallel_sha256="")
    fast = LocalOrigin(root)
    fast_url = await fast.start()
    try:
        node = Node(children, work)
        await node.start(origins={HOST: fast_url}, args=["--workers", str(args.workers)] if args.workers > 1 else [])
        await node.serving_workers(args.workers)
        workers = node.workers()
        nginx = Nginx(children, work)
        await nginx.start(proxy_conf(fast_url, workers))
        for url in (node.url, nginx.url):
            await curl(children, url + data.large, host=HOST, expect_bytes=p.large_bytes)
        await node.settled()
        res = Results()
        node_rps, nginx_rps, node_us = await range_small(children, work, p=p, node=node, nginx=nginx, data=data,
                                                         res=res)
    finally:
        await children.stop_all()
        await fast.stop()
    ratio, name = node_rps / nginx_rps, range_key(workers)
    return "\n".join([
        "",
        f"1 MiB ranges of a warm object ({os.cpu_count()} CPUs; cache node {workers} process, nginx "
        f"worker_processes {workers}; {time.monotonic() - started:.0f}s)",
        f"  code: {source_version()}; nginx: {nginx_version()}",
        "",
        *res.table(),
        "",
        f"ratios: {name}={ratio:.3f} range_cpu_us={node_us:.0f}",
    ])


class DigestOrigin(LocalOrigin):
    """LocalOrigin's files under /<kind>/NAME as well, a 200 for one
    publishing the digest fields of `kind` (none, sha256, crc64nvme, or a
    wrong sha256); a 206 publishes none, as S3 leaves them off a range.
    Unthrottled: FileResponse (sendfile, ranges); with `rate`: throttled per
    connection and answering ranges, as LocalOrigin(rate=, ranges=True)."""

    def __init__(self, root: Path, fields: dict[str, dict[str, str]], *, rate: float | None = None) -> None:
        super().__init__(root, rate=rate, ranges=rate is not None)
        self.fields = fields

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_route("GET", "/{kind}/{tail:.*}", self._by_kind)
        app.on_response_prepare.append(self._publish)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = port or free_port()
        await web.TCPSite(self._runner, host, self.port).start()
        return f"http://{host}:{self.port}"

    async def _by_kind(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        return await self._handle(request.clone(rel_url=request.rel_url.with_path("/" + request.match_info["tail"]),
                                                headers={**request.headers, "X-Bench-Kind": kind}))

    async def _publish(self, request: web.Request, response: web.StreamResponse) -> None:
        kind = request.headers.get("X-Bench-Kind") or request.path.split("/")[1]
        if response.status == 200:
            response.headers.update(self.fields.get(kind, {}))


def large_digests(path: Path, sha256_hex: str) -> dict[str, dict[str, str]]:
    """The digest fields DigestOrigin publishes for the file at `path`, by kind."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(8 * MiB):
            crc = checksums.crc64nvme(block, crc)
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return {"none": {},
            "sha256": {"x-amz-checksum-sha256": b64(bytes.fromhex(sha256_hex))},
            "crc64nvme": {"x-amz-checksum-crc64nvme": b64(crc.to_bytes(8, "big"))},
            "wrong": {"x-amz-checksum-sha256": b64(hashlib.sha256(b"not these bytes").digest())}}


async def fill_verify(children: Children, work: Path, *, p: Plan, data: Dataset, res: Results,
                      rate: float | None = None) -> dict[str, float]:
    """Cold fills of the large object with a digest checked ÷ without one (`fill_verify`), each kind
    `p.runs` times, alternating; a node of its own whose capacity keeps two objects (the older evicted).
    `rate`: from an origin throttled to it per connection that answers ranges (a parallel fill at the
    network's pace, `fill_verify_ranged`); None: the unthrottled origin (CPU-bound here)."""
    size = data.large_bytes
    name = data.large.lstrip("/")
    fields = await asyncio.get_running_loop().run_in_executor(None, large_digests, data.root / name,
                                                              data.large_sha256)
    origin = DigestOrigin(data.root, fields, rate=rate)
    url = await origin.start()
    node = Node(children, work, name="verify")
    which = "the fast origin" if rate is None else f"the ranged origin at {rate / 1e6:g} MB/s per connection"
    try:
        await node.start(origins={HOST: url}, args=["--capacity", str(2 * size + MiB)])
        say(f"fill_verify: cold fills of {size / MiB:.0f} MiB from {which}, digest checked or not, "
            f"{p.runs} runs each:")
        async with aiohttp.ClientSession() as session:  # the check is on: a wrong digest cuts the fill
            got = 0
            try:
                async with session.get(f"{node.url}/wrong/{name}?run=0", headers={"Host": HOST}) as r:
                    async for chunk in r.content.iter_any():
                        got += len(chunk)
            except aiohttp.ClientPayloadError:
                pass
            if got >= size:
                raise BenchError(f"fill_verify: a fill under a wrong sha256 sent all {got} bytes: no check ran")
        await node.settled()
        if (seen := await mismatches(node)) != 1:
            raise BenchError(f"fill_verify: nezha_digest_mismatches_total is {seen} after one wrong fill, not 1")
        runs: dict[str, list[Transfer]] = {"none": [], "sha256": [], "crc64nvme": []}
        cpu: dict[str, list[float]] = {kind: [] for kind in runs}
        assert node.proc is not None
        for n in range(1, p.runs + 1):
            for kind in runs:
                await settle_disk(work, size)
                with Sampler(node.proc.pid) as s:
                    t = await curl(children, f"{node.url}/{kind}/{name}?run={n}", host=HOST, expect_bytes=size)
                    expect_header(t, CACHE_HEADER, CacheOutcome.MISS, what=f"cold GET of /{kind}/{name}")
                    await node.settled()
                runs[kind].append(t)
                cpu[kind].append(s.per_gib(size))
        if await mismatches(node) != 1:
            raise BenchError("fill_verify: a fill of the right bytes was counted a mismatch")
    finally:
        if node.proc is not None:
            await children.stop(node.proc)
        await origin.stop()
    for kind, what in (("none", "no digest"), ("sha256", "x-amz-checksum-sha256 checked"),
                       ("crc64nvme", "x-amz-checksum-crc64nvme checked")):
        res.add(f"large cold{'' if rate is None else ', ranged origin'}, {what}",
                f"{median_mbps(runs[kind]):.0f} MB/s", None,
                f"{spread(runs[kind])}; node {statistics.median(cpu[kind]):.2f} CPU s per GiB")
    none = median_mbps(runs["none"])
    return {"sha256": median_mbps(runs["sha256"]) / none, "crc64nvme": median_mbps(runs["crc64nvme"]) / none}


async def mismatches(node: Node) -> float:
    """nezha_digest_mismatches_total of `node`, every origin's."""
    async with aiohttp.ClientSession() as s:
        async with s.get(node.url + "/metrics") as r:
            text = await r.text()
    return sum(float(v) for v in re.findall(r"^nezha_digest_mismatches_total\{[^}]*\} (\S+)$", text, re.M))


async def run_fill_verify_only(args: argparse.Namespace, work: Path, children: Children) -> str:
    """`--fill-verify-only`: fill_verify alone."""
    p = plan(args)
    started = time.monotonic()
    root = work / "origin"
    say(f"fill_verify only: {p.large_bytes / MiB:.0f} MiB object, {os.cpu_count()} CPUs, work dir {work}")
    sha = await asyncio.get_running_loop().run_in_executor(None, write_random, root / "large.bin", p.large_bytes)
    data = Dataset(root=root, large="/large.bin", large_bytes=p.large_bytes, large_sha256=sha, small=[], cold=[],
                   cold_direct="", cold_bytes=0, profile_cold=[], parallel_direct="", parallel_cold="",
                   parallel_fifty="", parallel_bytes=0, parallel_sha256="")
    res = Results()
    verify = await fill_verify(children, work, p=p, data=data, res=res)
    ranged = await fill_verify(children, work, p=p, data=data, res=res, rate=args.rate)
    return "\n".join([
        "",
        f"Cold fills with a digest checked ({os.cpu_count()} CPUs; {time.monotonic() - started:.0f}s)",
        f"  code: {source_version()}",
        "",
        *res.table(),
        "",
        f"  fill_verify sha256 checked / none {verify['sha256']:6.3f}  target >= 0.95  "
        f"{'met' if verify['sha256'] >= 0.95 else 'NOT met'}  (crc64nvme: {verify['crc64nvme']:.3f})",
        f"  fill_verify_ranged sha256 / none, throttled ranged origin {ranged['sha256']:6.3f}  target >= 0.95  "
        f"{'met' if ranged['sha256'] >= 0.95 else 'NOT met'}  (crc64nvme: {ranged['crc64nvme']:.3f})",
        f"ratios: fill_verify={verify['sha256']:.3f} fill_verify_crc64nvme={verify['crc64nvme']:.3f} "
        f"fill_verify_ranged={ranged['sha256']:.3f} fill_verify_ranged_crc64nvme={ranged['crc64nvme']:.3f}",
    ])


async def run_verify_reads_only(args: argparse.Namespace, work: Path, children: Children) -> str:
    """`--verify-reads-only`: verify_large and verify_small, warm throughput of a
    node with --verify-reads ÷ the same node without (issue 37 item 3).

    Two nodes on one origin, each warmed once; then, alternating run by run
    so drift on a shared machine hits both alike, curl of the large object
    and wrk over the small ones. A large hit with --verify-reads reads its
    blocks (from the page cache) before sendfile sends them; a small hit's
    seal is checked on every read either way (cachenode/store/small.py)."""
    p = plan(args)
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    say(f"verify_reads only: {p.large_bytes / MiB:.0f} MiB object, {p.small_count} x {p.small_bytes // KiB} KiB, "
        f"{os.cpu_count()} CPUs, work dir {work}")
    data = await loop.run_in_executor(None, make_dataset, work / "origin", p)
    origin = LocalOrigin(data.root)
    url = await origin.start()
    res = Results()
    try:
        extra = ["--workers", str(args.workers)] if args.workers > 1 else []
        plain, checked = Node(children, work, name="plain"), Node(children, work, name="checked")
        await plain.start(origins={HOST: url}, args=extra)
        await checked.start(origins={HOST: url}, args=[*extra, "--verify-reads"])
        size = data.large_bytes
        script = work / "paths.lua"
        script.write_text(WRK_LUA % {"paths": ", ".join(f'"{s}"' for s in data.small), "host": HOST})
        for node in (plain, checked):
            await node.serving_workers(args.workers)
            await curl(children, node.url + data.large, host=HOST, expect_bytes=size)
            await node.settled()
            if await curl_sha256(children, node.url + data.large, host=HOST) != data.large_sha256:
                raise BenchError(f"{node.name}: the large object's bytes differ from the origin's")
            await prime_small(node.url, node.url, data.small)
            await node.settled()
        misses = {node.name: (await node.counters())["nezha_cache_misses_total"] for node in (plain, checked)}
        large: dict[str, list[Transfer]] = {"plain": [], "checked": []}
        small: dict[str, list[WrkResult]] = {"plain": [], "checked": []}
        for _ in range(p.runs):
            for node in (plain, checked):
                t = await curl(children, node.url + data.large, host=HOST, expect_bytes=size)
                expect_header(t, CACHE_HEADER, CacheOutcome.HIT, what=f"warm large GET through {node.name}")
                large[node.name].append(t)
        for _ in range(p.wrk_runs):
            for node in (plain, checked):
                small[node.name].append(await wrk(children, node.url + "/", script, p=p))
        for node in (plain, checked):
            if (await node.counters())["nezha_cache_misses_total"] != misses[node.name]:
                raise BenchError(f"{node.name} missed during the warm runs: an object was dropped as corrupt?")
        for name in ("plain", "checked"):
            res.add(f"large warm, {name}", f"{median_mbps(large[name]):.0f} MB/s", None, spread(large[name]))
            res.add(f"small warm, {name}", f"{statistics.median(r.rps for r in small[name]):.0f} req/s", None,
                    _wrk_note(small[name]))
        verify_large = median_mbps(large["checked"]) / median_mbps(large["plain"])
        verify_small = statistics.median(r.rps for r in small["checked"]) / \
            statistics.median(r.rps for r in small["plain"])
    finally:
        await children.stop_all()
        await origin.stop()
    met = verify_large >= 0.9 and verify_small >= 0.9
    return "\n".join([
        "",
        f"Warm reads with --verify-reads ({os.cpu_count()} CPUs; {time.monotonic() - started:.0f}s)",
        f"  code: {source_version()}",
        "",
        *res.table(),
        "",
        f"  verify_large checked / plain {verify_large:6.3f}   verify_small checked / plain {verify_small:6.3f}"
        f"   default on only if both >= 0.9: {'met' if met else 'NOT met'}",
        f"ratios: verify_large={verify_large:.3f} verify_small={verify_small:.3f}",
    ])


async def settle_disk(work: Path, size: int) -> None:
    """Before a measurement that writes a large object: write back every
    dirty page, so no writer is throttled for the previous one's pages (two
    1 GiB fills in a row here: 991 then 389 MB/s), and write then delete
    twice `size` bytes, so the page cache's next pages are ones the machine
    has already touched. This VM's guest memory is backed lazily: a page
    never touched since it was freed costs a fault in the host, and a 1 GiB
    node-to-node copy measured 271-558 MB/s on fresh pages against 849-897
    right after 2 GiB were written and deleted. Every writer (the node,
    nginx, the copying node) gets the same start."""
    def settle() -> None:
        scratch = work / "prefault.tmp"
        block = b"\0" * (1 << 20)
        with open(scratch, "wb", buffering=0) as f:
            for _ in range(2 * size // len(block)):
                f.write(block)
        scratch.unlink()
        os.sync()

    await asyncio.get_running_loop().run_in_executor(None, settle)


async def replicate(peer: Node, *, source: Node, path: str, size: int) -> float:
    """Have `peer` copy `path` from `source` (a lone node trusts loopback callers), MB/s of the copy."""
    body = {"host": HOST, "path": path, "source": f"127.0.0.1:{source.port}",
            "address": f"127.0.0.1:{source.port}"}
    started = time.monotonic()
    result = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as s:
        async with s.post(peer.url + REPLICATE_PATH, json=body) as r:
            if r.status != 200:
                raise BenchError(f"replicate answered {r.status}: {(await r.text())[:300]}")
            async for line in r.content:
                if line.strip():
                    result = json.loads(line)
    seconds = time.monotonic() - started
    if not result or result.get("result") != ReplicateResult.COPIED or result.get("bytes") != size:
        raise BenchError(f"replicate of {path} ended with {result}, expected {ReplicateResult.COPIED} with {size} bytes")
    return size / seconds / 1e6


async def profile_node(out: Path, children: Children, *, node: Node, data: Dataset, script: Path,
                       p: Plan) -> None:
    """Sample the node with py-spy under each load, after the measurements (py-spy costs CPU).

    Writes <phase>.folded (collapsed stacks, for flamegraph.pl or speedscope)
    for: warm small objects, warm large object, cold fill.
    """
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        raise BenchError("--profile needs py-spy: pip install py-spy")
    out.mkdir(parents=True, exist_ok=True)
    assert node.proc is not None

    async def sampled(phase: str, work) -> None:
        spy = await children.spawn(pyspy, "record", "--pid", str(node.proc.pid), "--rate", "250",
                                   "--format", "raw", "-o", str(out / f"{phase}.folded"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # attach
        await work()
        await children.stop(spy, sig=signal.SIGINT)  # py-spy writes its file on SIGINT
        say(f"profile: {out / phase}.folded")

    async def small() -> None:
        await wrk(children, node.url + "/", script, p=p)

    async def large() -> None:
        for _ in range(3):
            await curl(children, node.url + data.large, host=HOST, expect_bytes=data.large_bytes)

    fresh = iter(data.profile_cold)

    async def cold_fill() -> None:
        t = await curl(children, node.url + next(fresh), host=HOST, expect_bytes=data.large_bytes)
        expect_header(t, CACHE_HEADER, CacheOutcome.MISS, what="profiled cold fill")
        await node.settled()

    say("profiling the cache node with py-spy (not part of the figures) ...")
    await sampled("small", small)
    await sampled("large-warm", large)
    await sampled("cold-fill", cold_fill)


def spread_fine(transfers: list[Transfer]) -> str:
    return f"runs {', '.join(f'{t.mbps:.2f}' for t in transfers)}"


def _wrk_note(results: list[WrkResult]) -> str:
    runs = ", ".join(f"{r.rps:.0f}" for r in results)
    r = sorted(results, key=lambda r: r.rps)[len(results) // 2]
    return f"runs {runs}; p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms"


@dataclass
class OneWorkerEach:
    node_rps: float
    nginx_rps: float
    scale: float  # the node with N workers / with 1, adjacent runs
    wrk_cores: float  # CPU wrk itself used during the N-worker runs: what the node could not have


async def small_one_worker_each(children: Children, work: Path, *, p: Plan, script: Path, node: Node,
                                fast_url: str, paths: list[str], res: Results) -> OneWorkerEach:
    """With --workers N: the same small warm hits through a one-process node
    and a one-worker nginx, in rounds alternating with the N-worker node, for
    `small` (1 each) and `scale_small` (N ÷ 1) from adjacent runs."""
    one = Node(children, work, name="one-worker")
    await one.start(origins={HOST: fast_url})
    nginx1 = Nginx(children, work, name="nginx-one-worker")
    await nginx1.start(proxy_conf(fast_url, 1))
    await prime_small(one.url, nginx1.url, paths)
    await one.settled()
    await check_small_hits(one.url, nginx1.url, paths)
    many, single, ref, wrk_cpu, wall = [], [], [], 0.0, 0.0
    for _ in range(p.wrk_runs):
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        many.append(await wrk(children, node.url + "/", script, p=p))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wrk_cpu += (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        wall += time.monotonic() - started
        assert one.proc is not None and nginx1.proc is not None
        with Sampler(one.proc.pid) as s1:
            single.append(await wrk(children, one.url + "/", script, p=p))
        with Sampler(nginx1.proc.pid) as s2:
            ref.append(await wrk(children, nginx1.url + "/", script, p=p))
    result = OneWorkerEach(node_rps=statistics.median(r.rps for r in single),
                           nginx_rps=statistics.median(r.rps for r in ref),
                           scale=statistics.median(r.rps for r in many) / statistics.median(r.rps for r in single),
                           wrk_cores=wrk_cpu / wall)
    res.add("small warm through cache, 1 worker", f"{result.node_rps:.0f} req/s", s1.cpu_percent, _wrk_note(single))
    res.add("small warm through nginx, worker_processes 1", f"{result.nginx_rps:.0f} req/s", s2.cpu_percent,
            _wrk_note(ref))
    await children.stop(one.proc)
    await children.stop(nginx1.proc)
    return result


async def prime_small(cache_url: str, nginx_url: str, paths: list[str]) -> None:
    """Fetch every small object once through both, eight at a time."""
    sem = asyncio.Semaphore(8)
    async with aiohttp.ClientSession() as s:
        async def get(url: str) -> None:
            async with sem:
                async with s.get(url, headers={"Host": HOST}) as r:
                    await r.read()
                    if r.status != 200:
                        raise BenchError(f"priming {url}: {r.status}")
        await asyncio.gather(*(get(base + path) for base in (cache_url, nginx_url) for path in paths))


async def check_small_hits(cache_url: str, nginx_url: str, paths: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        for path in paths:
            for base, header, want in ((cache_url, CACHE_HEADER, CacheOutcome.HIT), (nginx_url, "X-Nginx-Cache", "HIT")):
                async with s.get(base + path, headers={"Host": HOST}) as r:
                    await r.read()
                    if r.headers.get(header) != want:
                        raise BenchError(f"{base}{path} is not warm: {header}: {r.headers.get(header)!r}")


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-"))
    children = Children()
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # also where a shell left SIGINT ignored
        loop.add_signal_handler(sig, task.cancel)
    try:
        report = await (run_range_only if args.range_only else run_fill_verify_only if args.fill_verify_only
                        else run_verify_reads_only if args.verify_reads_only else run)(args, work, children)
        print(report)
        return 0
    finally:
        await children.stop_all()
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="256 MiB object, short runs: under 2 minutes")
    ap.add_argument("--rate", type=float, default=20e6,
                    help="origin throttle for the cold ratio, bytes/s per connection (default 20e6)")
    ap.add_argument("--large-bytes", type=int, default=None, help="size of the large object")
    ap.add_argument("--runs", type=int, default=None, help="curl runs per large measurement")
    ap.add_argument("--wrk-seconds", type=int, default=None, help="duration of each wrk run")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    ap.add_argument("--workers", type=int, default=1, help="processes of the cache node (nezha cache --workers) "
                    "and nginx worker_processes alike; above 1, small hits are also measured with one of each, "
                    "for small and scale_small (default 1)")
    ap.add_argument("--range-only", action="store_true",
                    help="only range_small: 1 MiB ranges of the warm large object, cache vs nginx")
    ap.add_argument("--fill-verify-only", action="store_true",
                    help="only fill_verify: cold fills with a digest checked vs none, on a node of its own")
    ap.add_argument("--verify-reads-only", action="store_true",
                    help="only verify_large and verify_small: warm reads with --verify-reads vs without")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, nginx.conf)")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="afterwards, sample the node with py-spy under each load; stacks into DIR")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("psutil") is None:
        print("bench: psutil is missing: pip install psutil (it is in the test extras)", file=sys.stderr)
        return 2
    try:
        for path, package in ((CURL, "curl"), (NGINX, "nginx"), (WRK, "wrk")):
            ensure_tool(path, package)
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(main_async(args))
    except KeyboardInterrupt:
        print("bench: interrupted; children stopped, temp dir removed", file=sys.stderr)
        return 130
    except asyncio.CancelledError:
        print("bench: interrupted; children stopped, temp dir removed", file=sys.stderr)
        return 130
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
