#!/usr/bin/env python3
"""Cold small fills of two or more checkouts of the node, paired, in the same minutes.

`bench/small_files.py` measures `small_fill` against nginx with one node;
on a shared 2-core machine its ratios move with the box's load and file
creation far more than with the code. A change to a cold fill's CPU is
measured here instead: every checkout given with --tree runs one node
(`--workers 1`, or --workers: a number or auto, the node as shipped; CPU
per fill then summed over the node's processes), all in front of one origin (Debian's nginx serving N
files of 16 KiB), and each round runs the same wrk command (64
connections, small_files.py's Lua: every path asked once, so every request
is a cold fill) against each node in turn on paths no node has seen,
reversing the order every other round, with `os.sync()` and a second's
pause before each run. Reported per run: fills per second and the node's
own user and system CPU per fill from /proc/<pid>/stat, and per round
which node used less CPU per fill than the first tree's.

    python bench/small_fills_ab.py --tree main=/tmp/main-copy --tree new=. --rounds 8

A tree is NAME=DIR[:ENV=VALUE,...] (as bench/small_hits_ab.py's; PYTHON=PATH
runs its node on another interpreter). The work
folder (origin files and node stores) is on /dev/shm unless --work says
otherwise, so the box's file creation (docs/benchmarks.md) stays out of the
figures. Everything listens on 127.0.0.1.

--origin-rtt-ms MS puts the origin at a distance, as bench/small_files.py
does for its curve (its docstring and testkit/delayline.py say why a relay
and not netem): the origin in a network namespace of its own behind the
delay line (MS/2 each way, a new connection's handshake paid), the nodes and
wrk together in a second namespace. Needs root and a C compiler. A node's
CPU per fill is not the same there as on loopback (docs/benchmarks.md, "A
cold small fill with the origin 20 ms away, profiled"): with 64 fills
waiting on the origin the node is not always busy, and what it pays per fill
follows how busy it is, so a change meant for a distant origin is paired
there. The origin direct is not run: the ratio to it is small_files.py's.

--count-handled runs the nodes at --log-level info and counts, per run,
the requests the handler answered (a `request_completed` line without
`fast`) and the fills that streamed (`fill_completed` without `at_once`),
from each node's log: how many requests left the fast path. Logging
costs CPU, so the CPU per fill of such a run is not comparable with a run
without it; pair the CPU without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import psutil  # noqa: E402

from bench.harness import KiB, Children, Nginx, StaticFiles, nginx_conf, run_bench  # noqa: E402
from bench.small_files import HOST, cold, get, make_dataset, path_of, say  # noqa: E402
from bench.small_hits_ab import TreeNode, cpu_times, parse_tree  # noqa: E402
from testkit import delayline  # noqa: E402
from testkit.netns import Host, NetnsUnavailable, Network, check_available  # noqa: E402
from testkit.ports import free_port  # noqa: E402

CONF = dict(by="bench/small_fills_ab.py", worker_connections=4096, nofile=65536)


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    loop = asyncio.get_running_loop()
    root = work / "origin-files"
    say(f"small fills A/B: {len(args.tree)} nodes, {args.objects} objects of 16 KiB, {args.rounds} rounds of "
        f"{args.seconds} s, origin {'on loopback' if args.origin_rtt_ms is None else f'{args.origin_rtt_ms:g} ms away'}"
        f", work dir {work}")
    await loop.run_in_executor(None, make_dataset, root, args.objects, 16 * KiB)
    if args.origin_rtt_ms is None:
        origin = Nginx(children, work, "origin")
        await origin.start(nginx_conf(StaticFiles(root=root), **CONF))
        return await paired(args, work, children, origin.url)
    net = Network(hosts=[Host("origin"), Host("client")])
    with net:
        at = net.address("origin")
        with net.inside("origin"):
            origin = Nginx(children, work, "wan-origin", address=at)
            await origin.start(nginx_conf(StaticFiles(root=root), **CONF))
            port = free_port()
            line = await children.spawn(*delayline.argv((at, port), (at, origin.port), args.origin_rtt_ms / 2000),
                                        stdout=asyncio.subprocess.PIPE)
            assert line.stdout is not None
            if (await asyncio.wait_for(line.stdout.readline(), 30)).strip() != b"listening":
                raise SystemExit("the delay line did not start")
        try:
            with net.inside("client"):  # the nodes, their origin connections and wrk: in-cluster, together
                return await paired(args, work, children, f"http://{at}:{port}")
        finally:
            await children.stop_all()  # before the namespaces go


async def paired(args: argparse.Namespace, work: Path, children: Children, origin_url: str) -> str:
    trees = [parse_tree(t) for t in args.tree]
    loop = asyncio.get_running_loop()
    nodes = []
    for name, tree, env in trees:
        node = TreeNode(children, work, name=name, tree=tree, env=env)
        await node.start(origins={HOST: origin_url}, workers=None if args.workers == "auto" else int(args.workers),
                         args=("--log-level", "info") if args.count_handled else ())
        nodes.append(node)
    warm = 64 * len(nodes)
    async with aiohttp.ClientSession() as s:  # every node's code path and origin connections, on paths of its own
        for i, node in enumerate(nodes):
            for n in range(args.objects - warm + 64 * i, args.objects - warm + 64 * (i + 1)):
                await get(s, node.url, path_of(n))
    counted = {n.name: Handled(work / f"{n.name}.log") for n in nodes}  # from here: the warming is not counted
    runs = args.rounds * len(nodes)
    per_run = (args.objects - warm) // runs
    cpu: dict[str, list[float]] = {n.name: [] for n in nodes}
    user: dict[str, list[float]] = {n.name: [] for n in nodes}
    system: dict[str, list[float]] = {n.name: [] for n in nodes}
    rps: dict[str, list[float]] = {n.name: [] for n in nodes}
    slot = 0
    for r in range(args.rounds):
        for node in (nodes if r % 2 == 0 else nodes[::-1]):
            await loop.run_in_executor(None, os.sync)
            await asyncio.sleep(1.0)
            assert node.proc is not None
            started = psutil.Process(node.proc.pid)  # with workers, every process under it too
            procs = [started, *started.children(recursive=True)]
            before = cpu_times(procs)
            done = await cold(children, node.url, work, slot * per_run, per_run, args.seconds, f"{node.name}{r}")
            after = cpu_times(procs)
            alive = before.keys() & after.keys()
            u0, s0 = sum(before[p][0] for p in alive), sum(before[p][1] for p in alive)
            u1, s1 = sum(after[p][0] for p in alive), sum(after[p][1] for p in alive)
            slot += 1
            fills = max(1, done.requests)
            us = 1e6 / fills
            user[node.name].append((u1 - u0) * us)
            system[node.name].append((s1 - s0) * us)
            cpu[node.name].append((u1 - u0 + s1 - s0) * us)
            rps[node.name].append(done.rps)
            say(f"  round {r} {node.name}: {done.rps:.0f} fills/s, {user[node.name][-1]:.0f} + "
                f"{system[node.name][-1]:.0f} = {cpu[node.name][-1]:.0f} CPU us per fill ({len(alive)} processes)"
                + (f"; {counted[node.name].since_last()}" if args.count_handled else ""))
    ref = nodes[0].name
    lines = []
    for node in nodes:
        n = node.name
        less = sum(a < b for a, b in zip(cpu[n], cpu[ref]))
        lines.append(f"{n}: {statistics.median(rps[n]):.0f} fills/s, {statistics.median(user[n]):.0f} + "
                     f"{statistics.median(system[n]):.0f} = {statistics.median(cpu[n]):.0f} us per fill "
                     f"(median; {min(cpu[n]):.0f} to {max(cpu[n]):.0f})"
                     + ("" if n == ref else f", less CPU than {ref} in {less} of {len(cpu[n])} pairs")
                     + (f"; over every run {counted[n].total()}" if args.count_handled else ""))
    return "\n".join(lines)


class Handled:
    """What a node's log (at info level) says of its requests: how many the
    handler answered rather than the fast path, and how many fills streamed."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.offset = 0
        self.requests = self.handled = self.fills = self.streamed = 0
        self._read()  # what is logged so far is not counted
        self.requests = self.handled = self.fills = self.streamed = 0
        self._last = (0, 0, 0, 0)

    def _read(self) -> None:
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        for line in data[:end].splitlines():
            if b"request_completed" not in line and b"fill_completed" not in line:
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "request_completed":
                self.requests += 1
                self.handled += not e.get("fast")
            elif e.get("event") == "fill_completed":
                self.fills += 1
                self.streamed += not e.get("at_once")

    @staticmethod
    def _say(requests: int, handled: int, fills: int, streamed: int) -> str:
        return (f"{handled} of {requests} requests answered by the handler ({100 * handled / max(1, requests):.1f}%), "
                f"{streamed} of {fills} fills streamed")

    def since_last(self) -> str:
        self._read()
        now = (self.requests, self.handled, self.fills, self.streamed)
        delta = [a - b for a, b in zip(now, self._last)]
        self._last = now
        return self._say(*delta)

    def total(self) -> str:
        self._read()
        return self._say(self.requests, self.handled, self.fills, self.streamed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR[:ENV=VALUE,...], the first the reference")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--objects", type=int, default=200_000)
    ap.add_argument("--workers", default="1", help="each node's --workers: a number, or auto (the node as shipped, "
                    "no flag); CPU per fill is then the sum over the node's processes (default 1)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"), help="where the work folder goes (/dev/shm)")
    ap.add_argument("--origin-rtt-ms", type=float, help="the origin this far away, behind the delay line in a "
                    "namespace of its own (root; see the docstring); default: on loopback")
    ap.add_argument("--count-handled", action="store_true", help="nodes at --log-level info: count the requests "
                    "the handler answered and the fills that streamed (their CPU then includes logging)")
    args = ap.parse_args()
    if len(args.tree) < 2:
        raise SystemExit("give two trees or more")
    if args.origin_rtt_ms is not None:
        try:
            check_available()
            delayline.binary()
        except (NetnsUnavailable, delayline.DelayLineUnavailable) as e:
            raise SystemExit(f"small_fills_ab: {e}")
    run_bench(lambda work, children: run(args, work, children), prefix=f"{args.work}/nezha-fills-ab-", keep=False)

if __name__ == "__main__":
    main()
