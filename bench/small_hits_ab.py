#!/usr/bin/env python3
"""Warm small hits of several checkouts of the node, side by side with nginx, in the same minutes.

`bench/throughput.py --quick` measures `small` with one 5-second wrk run
each; on a shared 2-core machine one run varies by 2x. This A/B puts every
variant up at once (one node per checkout given with --tree, each one
process, and nginx with one worker, all in front of the same origin and 200
warm 100 KiB objects, as in throughput.py) and runs the same wrk command
against each in turn for several rounds, reversing the order every other
round, so drift hits all alike. Besides req/s it reports each server's CPU
microseconds per request (user + system of its process tree over the run,
from psutil): with wrk on the same two cores, req/s also depends on how
much CPU the server leaves to the load generator, and CPU per request is
what per-core efficiency means.

    python bench/small_hits_ab.py --tree base=/tmp/main-copy --tree new=. \\
        --tree new-uvloop=.:NEZHA_EVENT_LOOP=uvloop --rounds 6

A tree is NAME=DIR[:ENV=VALUE,...]; DIR is put first on the node's
PYTHONPATH (a `git worktree` or `git archive` copy of another commit), ENV
is added to its environment, but for PYTHON=PATH: the interpreter the node
runs on (a venv's python with the project's dependencies; docs/benchmarks.md,
"The interpreter"). The first tree is the reference of the
per-round ratios. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from bench import harness  # noqa: E402
from bench.harness import KiB, Children, Nginx, Node  # noqa: E402
from bench.throughput import HOST, WRK_LUA, Plan, check_small_hits, prime_small, proxy_conf, say, wrk  # noqa: E402
from nezha.dev.origin import LocalOrigin  # noqa: E402

COUNT, SIZE = 200, 100 * KiB  # as bench/throughput.py's small objects


class TreeNode(Node):
    """A node run from another checkout (`tree`), with extra environment; its
    PYTHON, when given, is the interpreter it runs on, not a variable."""

    def __init__(self, children: Children, work: Path, *, name: str, tree: Path, env: dict[str, str]) -> None:
        env = dict(env)
        super().__init__(children, work, name=name, python=env.pop("PYTHON", sys.executable))
        self.tree, self.env = tree, env

    async def start(self, **kw) -> None:
        repo, repo_env = harness.REPO, harness.repo_env
        harness.REPO = self.tree
        harness.repo_env = lambda: {**os.environ, "PYTHONPATH": str(self.tree), **self.env}
        try:
            await super().start(**kw)
        finally:
            harness.REPO, harness.repo_env = repo, repo_env


@dataclass
class Runs:
    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)  # CPU microseconds per request


def parse_tree(spec: str) -> tuple[str, Path, dict[str, str]]:
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise SystemExit(f"--tree {spec!r}: expected NAME=DIR[:ENV=VALUE,...]")
    folder, _, envs = rest.partition(":")
    env = dict(e.split("=", 1) for e in envs.split(",") if e)
    path = Path(folder).resolve()
    if not (path / "cachenode").is_dir():
        raise SystemExit(f"--tree {spec!r}: {path} holds no cachenode/ (not a checkout of this project)")
    return name, path, env


def cpu_times(procs: list[psutil.Process]) -> dict[int, tuple[float, float]]:
    """User and system seconds of each process still alive (nginx's cache loader exits on its own)."""
    out = {}
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[proc.pid] = (t.user, t.system)
    return out


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    """User + system seconds of each process still alive (`cpu_times`)."""
    return {pid: user + system for pid, (user, system) in cpu_times(procs).items()}


async def measure(children: Children, url: str, pid: int, script: Path, p: Plan) -> tuple[float, float]:
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    before = cpu_seconds(procs)
    result = await wrk(children, url + "/", script, p=p)
    after = cpu_seconds(procs)
    cpu = sum(after[pid] - before[pid] for pid in before if pid in after)
    return result.rps, cpu / result.requests * 1e6


async def run(args: argparse.Namespace) -> None:
    trees = [parse_tree(t) for t in args.tree]
    work = Path(tempfile.mkdtemp(prefix="nezha-ab-"))
    children = Children()
    (work / "origin" / "small").mkdir(parents=True)
    paths = []
    for i in range(COUNT):
        (work / "origin" / f"small/s{i:03d}.bin").write_bytes(os.urandom(SIZE))
        paths.append(f"/small/s{i:03d}.bin")
    origin = LocalOrigin(work / "origin")
    upstream = await origin.start()
    p = Plan(large_bytes=0, runs=0, small_count=COUNT, small_bytes=SIZE, connections=args.connections,
             wrk_seconds=args.seconds, wrk_runs=1, cold_bytes=None, cold_runs=0, rate=0, parallel_bytes=0)
    script = work / "paths.lua"
    script.write_text(WRK_LUA % {"paths": ", ".join(f'"{s}"' for s in paths), "host": HOST})
    try:
        servers: dict[str, tuple[str, int]] = {}
        for name, tree, env in trees:
            node = TreeNode(children, work, name=name, tree=tree, env=env)
            await node.start(origins={HOST: upstream})
            assert node.proc is not None
            servers[name] = (node.url, node.proc.pid)
        nginx = Nginx(children, work)
        await nginx.start(proxy_conf(upstream, 1))
        assert nginx.proc is not None
        for url, _ in servers.values():
            await prime_small(url, nginx.url, paths)
            await harness.settled(url)
            await check_small_hits(url, nginx.url, paths)
        servers["nginx"] = (nginx.url, nginx.proc.pid)
        runs = {name: Runs() for name in servers}
        for r in range(args.rounds):
            order = list(servers.items())
            if r % 2:
                order.reverse()
            for name, (url, pid) in order:
                rps, cpu_us = await measure(children, url, pid, script, p)
                runs[name].rps.append(rps)
                runs[name].cpu_us.append(cpu_us)
                say(f"round {r + 1} {name}: {rps:.0f} req/s, {cpu_us:.1f} CPU us/request")
    finally:
        await children.stop_all()
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(runs, reference=trees[0][0], load=os.getloadavg()[0])


def report(runs: dict[str, Runs], *, reference: str, load: float) -> None:
    def row(xs: list[float], fmt: str) -> str:
        return " ".join(format(x, fmt) for x in xs)

    ng = runs["nginx"]
    print(f"load average at the end: {load:.1f}")
    for name, r in runs.items():
        print(f"{name:>12}: req/s {row(r.rps, '.0f')} (median {statistics.median(r.rps):.0f}); "
              f"CPU us/request {row(r.cpu_us, '.1f')} (median {statistics.median(r.cpu_us):.1f})")
    for name, r in runs.items():
        if name == "nginx":
            continue
        small = [a / b for a, b in zip(r.rps, ng.rps)]
        per_core = [b / a for a, b in zip(r.cpu_us, ng.cpu_us)]  # requests per CPU second, / nginx's
        print(f"{name:>12} / nginx: req/s by round {row(small, '.3f')} (median {statistics.median(small):.3f}); "
              f"requests per CPU second by round {row(per_core, '.3f')} (median {statistics.median(per_core):.3f})")
    ref = runs[reference]
    for name, r in runs.items():
        if name in ("nginx", reference):
            continue
        rps = [a / b for a, b in zip(r.rps, ref.rps)]
        cpu = [a / b for a, b in zip(r.cpu_us, ref.cpu_us)]
        print(f"{name:>12} / {reference}: req/s by round {row(rps, '.3f')} (median {statistics.median(rps):.3f}); "
              f"CPU per request by round {row(cpu, '.3f')} (median {statistics.median(cpu):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=DIR[:ENV=VALUE,...]",
                    help="a checkout to run a node from (repeat); the first is the reference")
    ap.add_argument("--rounds", type=int, default=5, help="wrk runs per server (default 5)")
    ap.add_argument("--seconds", type=int, default=5, help="duration of each wrk run (default 5)")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
