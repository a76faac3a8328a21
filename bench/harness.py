"""What every benchmark in bench/ shares: its children, its tools, the servers it measures.

Each script measures something of its own, but they all start `nezha
cache` nodes and nginx as child processes on 127.0.0.1, must stop them on
any exit, check or install the tools they drive, sample a process tree's
CPU and memory, and write random data. One copy of each lives here, so a
fix (a child that outlived its benchmark, a readiness wait that hung) is
made once. Free ports, the redis-server launcher and the Kubernetes API
double come from testkit/, as the tests get them; nothing here or in a
script imports tests/.

Scripts put the repository root on sys.path, then `from bench.harness
import ...`. Not collected by pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Sequence

import aiohttp

from testkit.ports import free_port
from testkit.waits import NotAnswering, until_http, until_port

REPO = Path(__file__).resolve().parent.parent
NGINX = "/usr/sbin/nginx"
WRK = "/usr/bin/wrk"
CURL = "/usr/bin/curl"
MiB = 1 << 20
KiB = 1 << 10


class BenchError(Exception):
    """The benchmark cannot run or a measurement is not what it claims to be."""


# -- processes -----------------------------------------------------------------

def _die_with_parent() -> None:
    """Child side of fork: get SIGTERM if the benchmark itself is killed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_bench(run: "Callable[[Path, Children], Awaitable[str]]", *, prefix: str, keep: bool) -> None:
    """Run a benchmark's `run(work, children)` in a fresh work directory and
    print its result line: Ctrl-C or SIGTERM cancels it, every process it
    started is stopped, the directory is removed unless `keep`; a BenchError
    is printed as `bench failed: ...` and exits 1."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    children = Children()

    async def main_async() -> str:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await run(work, children)
        finally:
            await children.stop_all()

    try:
        line = asyncio.run(main_async())
    except BenchError as e:
        print(f"bench failed: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(line)


class Children:
    """Every process the benchmark starts, so that one `finally` can stop them all."""

    def __init__(self) -> None:
        self._procs: list[asyncio.subprocess.Process] = []

    async def spawn(self, *argv: str, **kw) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *argv, start_new_session=True, preexec_fn=_die_with_parent, **kw)
        self._procs.append(proc)
        return proc

    async def run(self, *argv: str, timeout: float) -> str:
        """Run to completion and return stdout; fail naming the command and its stderr."""
        proc = await self.spawn(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            raise BenchError(f"{argv[0]} did not finish within {timeout:g}s: {' '.join(argv)}") from None
        finally:
            await self.stop(proc)
        if proc.returncode != 0:
            raise BenchError(f"{' '.join(argv)} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
        return out.decode(errors="replace")

    async def stop(self, proc: asyncio.subprocess.Process, *, sig: int = signal.SIGTERM) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if proc in self._procs:
            self._procs.remove(proc)

    async def stop_all(self) -> None:
        for proc in reversed(list(self._procs)):
            await self.stop(proc)


def ensure_tool(path: str, package: str) -> None:
    """Install a Debian package when its binary is missing; only root may."""
    if os.access(path, os.X_OK):
        return
    if os.geteuid() != 0:
        raise BenchError(f"{path} is missing; install Debian's {package} first "
                         f"(sudo apt-get install -y {package}), then rerun")
    print(f"{path} is missing; installing Debian's {package} ...", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Debian starts nginx on 0.0.0.0:80 when it is installed, unless
    # policy-rc.d says no; say no for the install if nothing else does.
    guard = Path("/usr/sbin/policy-rc.d")
    made_guard = not guard.exists()
    if made_guard:
        guard.write_text("#!/bin/sh\n# bench/harness.py: start no services while installing\nexit 101\n")
        guard.chmod(0o755)
    try:
        done = subprocess.run(["apt-get", "install", "-y", package], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True)
            done = subprocess.run(["apt-get", "install", "-y", package], env=env, capture_output=True, text=True)
    finally:
        if made_guard:
            guard.unlink(missing_ok=True)
    if done.returncode != 0 or not os.access(path, os.X_OK):
        raise BenchError(f"apt-get install -y {package} failed: {done.stderr[-500:]}")


def source_version() -> str:
    """Which cache node code is measured: the commit, and whether it was edited."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "cachenode", "nezha"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" + uncommitted changes in cachenode/ or nezha/" if dirty else "")


def interpreter(python: str) -> str:
    """Which Python a node runs on: its version and where, since a build with
    PGO and LTO runs this code faster (docs/benchmarks.md, "The interpreter")."""
    try:
        done = subprocess.run([python, "-c", "import platform, nezha.cli, cachenode.node; print(platform.python_implementation(), "
                               "platform.python_version())"], capture_output=True, text=True, env=repo_env())
    except OSError as e:
        raise BenchError(f"{python}: cannot run it: {e}") from None
    if done.returncode != 0:
        raise BenchError(f"{python}: cannot run this checkout's nezha: {done.stderr.strip()[-300:]}")
    return f"{done.stdout.strip()} ({python})"


def nginx_version() -> str:
    done = subprocess.run([NGINX, "-v"], capture_output=True, text=True)
    return done.stderr.strip().removeprefix("nginx version: ")


# -- servers ---------------------------------------------------------------------

def repo_env() -> dict[str, str]:
    """The environment for a `python -m nezha` child: this checkout first on its path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


async def settled(*urls: str, timeout: float = 120) -> None:
    """Until no node at `urls` has a fill in flight, so the next reads are hits."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            states = []
            for url in urls:
                async with s.get(url + "/readyz") as r:
                    states.append(await r.json())
            if all(st.get("fills_in_flight") == 0 for st in states):
                return
            await asyncio.sleep(0.05)
    raise BenchError(f"cache node still filling after {timeout:g}s")


class Node:
    """`nezha cache` as its own process, as an operator runs it.

    Listens on a free port of 127.0.0.1, keeps its objects in WORK/NAME and
    its log in WORK/NAME.log; `origins` become --origin flags, `args` are
    passed as they are (--tls-listen, --config, ...).
    """

    def __init__(self, children: Children, work: Path, name: str = "node", python: str = sys.executable) -> None:
        self.children = children
        self.work = work
        self.name = name
        self.python = python  # the interpreter it runs on (docs/benchmarks.md, "The interpreter")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, *, origins: dict[str, str] | None = None, args: Sequence[str] = (),
                    timeout: float = 30, workers: int | None = 1) -> None:
        """Spawn the node and wait for /readyz. `workers` None passes no --workers: the node as shipped
        (`auto`, a worker per usable CPU); a number, or --workers in `args`, is passed as given."""
        argv = [self.python, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{self.port}",
                "--data-dir", str(self.work / self.name), "--log-level", "warning"]
        for host, upstream in (origins or {}).items():
            argv += ["--origin", f"{host}={upstream}"]
        argv += args
        if workers is not None and "--workers" not in args:
            argv += ["--workers", str(workers)]  # the figures are per process unless a benchmark asks for more
        self.log = open(self.work / f"{self.name}.log", "wb")
        self.proc = await self.children.spawn(*argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO,
                                              env=repo_env())
        try:
            await until_http(self.url + "/readyz", timeout=timeout, proc=self.proc,
                             log=self.work / f"{self.name}.log", what="cache node", interval=0.1)
        except NotAnswering as e:
            raise BenchError(str(e)) from None

    def tail_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.work / f"{self.name}.log").read_text(errors="replace")[-1000:]
        return ""

    def workers(self) -> int:
        """Processes serving: with --workers, the supervisor's children (it serves nothing itself)."""
        import psutil

        assert self.proc is not None
        return len(psutil.Process(self.proc.pid).children(recursive=True)) or 1

    def _listening(self) -> int:
        import psutil

        assert self.proc is not None
        count = 0
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                       for c in child.net_connections(kind="tcp")):
                    count += 1
        return count

    async def serving_workers(self, n: int, timeout: float = 60) -> None:
        """Wait until `n` workers listen on the node's port (--workers n; at once for 1)."""
        if n <= 1:
            return
        deadline = time.monotonic() + timeout
        while self._listening() < n:
            if time.monotonic() > deadline:
                raise BenchError(f"cache node: {self._listening()} of {n} workers listen after {timeout:g} s\n"
                                 + self.tail_log())
            await asyncio.sleep(0.1)

    async def settled(self, timeout: float = 120) -> None:
        """Wait until fills have committed, so the next read is a hit."""
        await settled(self.url, timeout=timeout)

    async def counters(self) -> dict[str, float]:
        """The node's hit and miss counters, from /metrics."""
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/metrics") as r:
                text = await r.text()
        found = {}
        for name in ("nezha_cache_hits_total", "nezha_cache_misses_total"):
            m = re.search(rf"^{name} ([\d.e+]+)$", text, re.M)
            found[name] = float(m.group(1)) if m else 0.0
        return found


@dataclass(frozen=True)
class ProxyCache:
    """nginx `proxy_cache` in front of an origin: what a benchmark holds the cache node against.

    `upstream` is a URL (`http://127.0.0.1:8080`); with `keepalive` > 0 it
    becomes an `upstream` block keeping that many idle connections per
    worker, as a node keeps its own pool to the origin. `lock`: one fill per
    key, later requests wait for it (the node coalesces the same way).
    """

    upstream: str
    zone: str = "bench"
    keys_zone: str = "16m"
    max_size: int | str = "16g"
    lock: bool = True
    keepalive: int = 0


@dataclass(frozen=True)
class StaticFiles:
    """nginx serving a folder as an origin; over TLS when `cert` and `key` are given."""

    root: Path
    name: str = "_"
    cert: Path | None = None
    key: Path | None = None


def nginx_conf(site: ProxyCache | StaticFiles, *, by: str, workers: int | str = 1, worker_connections: int = 1024,
               nofile: int = 0, sendfile: bool = True) -> str:
    """One nginx config, as `Nginx.start` takes it: `%(user)s`, `%(prefix)s`, `%(address)s` and `%(port)d` left
    for it to fill.

    Every benchmark compares the node with the same nginx, so its settings
    live here once: `tcp_nopush` stays off (nginx's default; Debian's
    nginx.conf turns it on): with it, every cached 100 KiB response over
    keep-alive stalled ~40 ms on loopback (measured: 23 req/s on one
    connection instead of ~9,600), which would flatter the cache node.
    `by` names the benchmark in the file's first line.
    """
    def lit(value: object) -> str:  # a value put into the template, safe from its %-formatting
        return str(value).replace("%", "%%")

    lines = [f"# Written by {lit(by)}.",
             "%(user)s",
             f"worker_processes {workers};",
             "daemon off;",
             "master_process on;"]
    if nofile:
        lines.append(f"worker_rlimit_nofile {nofile};")
    lines += ["pid %(prefix)s/nginx.pid;",
              "error_log %(prefix)s/error.log warn;",
              f"events {{ worker_connections {worker_connections}; }}",
              "http {",
              "    access_log off;",
              f"    sendfile {'on' if sendfile else 'off'};",
              "    tcp_nopush off;",
              "    keepalive_requests 1000000;"]
    lines += [f"    {kind}_temp_path %(prefix)s/{folder};" for kind, folder in (
        ("client_body", "client_body"), ("proxy", "proxy_temp"), ("fastcgi", "fastcgi"), ("uwsgi", "uwsgi"),
        ("scgi", "scgi"))]
    if isinstance(site, ProxyCache):
        lines.append(f"    proxy_cache_path %(prefix)s/cache levels=1:2 keys_zone={lit(site.zone)}:{lit(site.keys_zone)} "
                     f"max_size={lit(site.max_size)} inactive=1h use_temp_path=off;")
        target = lit(site.upstream)
        if site.keepalive:
            lines += ["    upstream origin {",
                      f"        server {lit(site.upstream.removeprefix('http://'))};",
                      f"        keepalive {site.keepalive};",
                      "    }"]
            target = "http://origin"
        lines += ["    server {",
                  "        listen %(address)s:%(port)d;",
                  "        server_name _;",
                  "        location / {",
                  f"            proxy_pass {target};",
                  "            proxy_http_version 1.1;",
                  '            proxy_set_header Connection "";',
                  f"            proxy_cache {lit(site.zone)};",
                  "            proxy_cache_valid 200 1h;"]
        if site.lock:
            lines.append("            proxy_cache_lock on;")
        lines += ["            add_header X-Nginx-Cache $upstream_cache_status always;",
                  "        }",
                  "    }"]
    else:
        tls = site.cert is not None and site.key is not None
        lines += ["    server {",
                  f"        listen %(address)s:%(port)d{' ssl' if tls else ''};",
                  f"        server_name {lit(site.name)};"]
        if tls:
            lines += [f"        ssl_certificate {lit(site.cert)};", f"        ssl_certificate_key {lit(site.key)};"]
        lines += [f"        root {lit(site.root)};", "    }"]
    lines.append("}")
    return "\n".join(lines) + "\n"


class Nginx:
    """Debian's nginx as a child process, from a config `nginx_conf` built.

    The config is %-formatted with `user`, `prefix`, `address` and `port`
    (set here); everything nginx writes stays under WORK/NAME. It listens on
    `address` (127.0.0.1 unless a benchmark puts it on a namespace's link).
    As root nginx would drop its workers to `nobody`, who cannot write into
    the private temp dir: `user` keeps them as the caller.
    """

    def __init__(self, children: Children, work: Path, name: str = "nginx", address: str = "127.0.0.1") -> None:
        self.children = children
        self.prefix = work / name
        self.prefix.mkdir(parents=True, exist_ok=True)
        self.address = address
        self.port = free_port()
        self.url = f"http://{address}:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, template: str) -> None:
        conf = self.prefix / "nginx.conf"
        user = "user root root;" if os.geteuid() == 0 else ""
        conf.write_text(template % {"user": user, "prefix": self.prefix, "address": self.address, "port": self.port})
        self.proc = await self.children.spawn(
            NGINX, "-p", str(self.prefix), "-c", str(conf), "-e", str(self.prefix / "error.log"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await until_port(self.address, self.port, timeout=15, proc=self.proc, log=self.prefix / "error.log",
                             what="nginx", interval=0.1)
        except NotAnswering as e:
            raise BenchError(str(e)) from None

    def error_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.prefix / "error.log").read_text(errors="replace")[-1000:]
        return ""


# -- memory ----------------------------------------------------------------------

class Sampler:
    """Peak resident memory of a process tree, sampled every 50 ms on a thread,
    and the CPU the tree used meanwhile (100% = one core busy).

    A thread, not a task: the event loop is busy serving the origin, and a
    late sample would miss a peak. `tree=False` reads the process alone: for
    one that forks nothing, the walk of /proc that finding children costs
    would only load the machine being measured.
    """

    def __init__(self, pid: int, *, interval: float = 0.05, tree: bool = True) -> None:
        import psutil

        self._root = psutil.Process(pid)
        self._psutil = psutil
        self.tree = tree
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self.cpu_percent = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _tree(self) -> list:
        if not self.tree:
            return [self._root]
        try:
            return [self._root] + self._root.children(recursive=True)
        except self._psutil.Error:
            return []

    def tree_rss(self) -> int:
        total = 0
        for p in self._tree():
            with contextlib.suppress(self._psutil.Error):
                total += p.memory_info().rss
        return total

    def tree_cpu(self) -> float:
        total = 0.0
        for p in self._tree():
            with contextlib.suppress(self._psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.tree_rss())
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Sampler":
        """Start sampling (what `with` does, for a span that is not one block)."""
        self._cpu0, self._t0 = self.tree_cpu(), time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.tree_rss())
        self.cpu_seconds = self.tree_cpu() - self._cpu0
        self.cpu_percent = 100 * self.cpu_seconds / max(1e-9, time.monotonic() - self._t0)

    def per_gib(self, size: int) -> float:
        """CPU seconds per GiB of a transfer of `size` bytes."""
        return self.cpu_seconds / (size / (1 << 30))


# -- data --------------------------------------------------------------------------

def write_random(path: Path, size: int) -> str:
    """`size` random bytes (incompressible, like a dataset archive); returns their SHA-256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(4 * MiB, left))
            f.write(block)
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()
