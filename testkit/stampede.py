"""Everyone at once, on a simulated network: K clients read one cold object through N cache nodes (issue 38).

One scene, used by the suite's small stampede and by bench/stampede.py:
every cache node, the origin, Redis and each group of clients is a host of
its own in `testkit.netns`, behind a link shaped at B bytes/s (the origin's
at O), so the links, not loopback, bound what the cluster can move.

    run(Scene(...), work)  ->  Outcome

builds the network in the machine's namespace, then runs this module as
`drive` inside the origin's namespace, where it serves the object (and
counts every body byte it sends), starts a real redis-server and `nezha
cache` processes in their namespaces, writes their ring, starts the client
groups (`read`, one process per group, in the group's namespace) and lets
them all go at one moment. Each client reads the whole object and reports
when its first and last byte came and the SHA-256 of what it got. While the
scene runs, the caller samples each link's byte counters (testkit.links)
for what it carried, its fastest second and its time above its cap.
Everything is deleted afterwards (testkit.netns).

Configurations: `direct` (the clients read from the origin; no cache),
`plain` (Nezha with hot copies and chunks off) and `shipped` (Nezha's
defaults, with the chunk threshold and size a scene sets). `kill_at`
SIGKILLs the key's first owner once the origin has sent that share of the
object (a leader dying mid-fill); clients reading through it are cut, and
only the others count as exact.

Client group i reads through node i (`Scene.groups`: K = clients pods
spread over the nodes round-robin, or at random as a Service's kube-proxy
picks an endpoint per connection); its link is not shaped (a group stands
for pods on many machines), so node links are the bottleneck the ideal
assumes: max(S / O, K·S / (N·B)).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testkit import links
from testkit.links import Sampler
from testkit.netns import Host, Network

REPO = Path(__file__).resolve().parents[1]
HOST = "datasets.stampede"
PATH = "/cold.bin"
ETAG = '"stampede-1"'
NODE_PORT = 8080
CONFIGS = ("direct", "plain", "shipped")
SPREADS = ("even", "random")


@dataclass(frozen=True)
class Scene:
    config: str  # one of CONFIGS
    nodes: int
    clients: int
    size: int  # S, bytes
    node_rate: int  # B, bytes/s each way on every node's link
    origin_rate: int  # O, bytes/s on the origin's link
    burst: int = 64 * 1024
    latency: float = 0.05
    kill_at: float | None = None  # share of S the origin has sent when the key's first owner is killed
    replicas: int = 2
    chunk_threshold: int | None = None  # `shipped`: the origin's chunk_threshold and chunk_size
    chunk_size: int | None = None
    timeout: float = 300.0
    log_level: str = "warning"  # the nodes' (their logs stay in the run's folder: `Outcome.work`)
    spread: str = "even"  # how clients pick a node: one of SPREADS (`groups`)
    seed: int = 0  # `random` spread: the choices', so a run can be repeated

    def __post_init__(self) -> None:
        if self.config not in CONFIGS:
            raise ValueError(f"config {self.config!r}: one of {', '.join(CONFIGS)}")
        if self.nodes < 1 or self.clients < 1 or self.size < 1:
            raise ValueError("nodes, clients and size must be positive")
        if self.spread not in SPREADS:
            raise ValueError(f"spread {self.spread!r}: one of {', '.join(SPREADS)}")

    @property
    def ideal(self) -> float:
        """Seconds: one origin fetch at O, or every node link busy sending K·S / N at B, whichever is longer."""
        return max(self.size / self.origin_rate, self.clients * self.size / (self.nodes * self.node_rate))

    @property
    def groups(self) -> list[int]:
        """Clients per node. `even`: round-robin, K/N each (what the ideal assumes). `random`: each client's
        one connection to a node picked at random, as a ClusterIP Service under kube-proxy (iptables mode)
        picks an endpoint per connection; seeded by `seed`, so the same seed is the same split."""
        if self.spread == "even":
            return [self.clients // self.nodes + (1 if i < self.clients % self.nodes else 0)
                    for i in range(self.nodes)]
        pick, counts = random.Random(self.seed), [0] * self.nodes
        for _ in range(self.clients):
            counts[pick.randrange(self.nodes)] += 1
        return counts

    def hosts(self) -> list[Host]:
        return ([Host("origin", self.origin_rate), Host("redis")]
                + [Host(f"node{i}", self.node_rate) for i in range(self.nodes)]
                + [Host(f"clients{i}") for i in range(self.nodes)])

    def node_settings(self, origin_url: str) -> dict:
        origin = {"host": HOST, "upstream": origin_url, "default_ttl": 3600}
        settings: dict = {"workers": 1, "log_level": self.log_level, "leave_settle": 0, "capacity": 4 * self.size + (1 << 30)}
        if self.config == "plain":
            settings.update(hot_reads=0, chunk_threshold=0)
        elif self.chunk_threshold is not None:
            origin.update(chunk_threshold=self.chunk_threshold, chunk_size=self.chunk_size or self.chunk_threshold)
        settings["origins"] = [origin]
        return settings


@dataclass
class Outcome:
    scene: Scene
    clients: list[dict]  # per client: group, status, bytes, sha256, first, last (seconds from the start), label
    origin_bytes: int  # body bytes the origin sent
    origin_requests: list[str]  # "GET" or the Range of each request the origin got
    exact: int  # clients that got every byte right
    cut: int  # clients whose node was killed under them
    # Each origin request as it came: seconds from the start, the host that asked (node<i>, clients<i>), its Range
    # or "GET", and the body bytes the origin sent for it (what a request cut short cost it).
    origin_log: list[dict] = field(default_factory=list)
    link_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)  # host: (sent, received) during the run
    link_peak: dict[str, float] = field(default_factory=dict)  # host: fastest 1 s of sending or receiving, bytes/s
    # The links' byte counters as sampled (about every 0.1 s): (seconds from the release, {host: (sent, received)}).
    link_series: list[tuple[float, dict[str, tuple[int, int]]]] = field(default_factory=list)
    # host: seconds its link ran above links.ABOVE_FACTOR × its cap (in windows of links.ABOVE_WINDOW s)
    link_above: dict[str, float] = field(default_factory=dict)
    node_cpu: dict[str, float] = field(default_factory=dict)  # node: CPU seconds it used from the release to the last byte
    owner: str | None = None
    killed: str | None = None
    work: Path | None = None  # the run's folder: the nodes' logs (<node>.log), their stores

    def times(self, which: str = "last") -> list[float]:
        """The exact clients' times to their last byte (or `which="first"`: to their first), sorted."""
        return sorted(c[which] for c in self.clients if c.get("exact") and c[which] is not None)

    def percentile(self, p: float, which: str = "last") -> float:
        t = self.times(which)
        if not t:
            return float("nan")
        return t[min(len(t) - 1, max(0, round(p / 100 * len(t) + 0.5) - 1))]

    def summary(self) -> dict:
        return {"p50": self.percentile(50), "p95": self.percentile(95), "p99": self.percentile(99),
                "max": max(self.times(), default=float("nan")), "ideal": self.scene.ideal,
                "origin_bytes": self.origin_bytes}


# -- the caller's side: build the network, run the scene inside it, sample the links ------------------------------

def run(scene: Scene, work: Path) -> Outcome:
    """The scene on a network of its own, deleted afterwards; raises RuntimeError naming what failed.
    Its files go to a new folder under `work`: a node must never start with another run's object."""
    work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{scene.config}-{scene.nodes}-", dir=work))
    net = Network(hosts=scene.hosts(), burst=scene.burst, latency=scene.latency)
    with net:
        spec = {"scene": asdict(scene), "work": str(work),
                "addresses": {h.name: net.address(h.name) for h in scene.hosts()},
                "exec": {h.name: net.argv(h.name) for h in scene.hosts()}}
        (work / "spec.json").write_text(json.dumps(spec))
        with Sampler(net.counters) as sampler:
            done = subprocess.run(net.argv("origin", sys.executable, "-m", "testkit.stampede", "drive",
                                           str(work / "spec.json")),
                                  cwd=REPO, env=_env(), capture_output=True, text=True, timeout=scene.timeout + 120)
    if done.returncode != 0:
        raise RuntimeError(f"stampede {scene.config} N={scene.nodes}: the scene failed ({done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    outcome = Outcome(scene=scene, clients=found["clients"], origin_bytes=found["origin_bytes"],
                      origin_requests=found["origin_requests"], exact=found["exact"], cut=found["cut"],
                      owner=found.get("owner"), killed=found.get("killed"), origin_log=found.get("origin_log", []),
                      work=work, node_cpu=found.get("node_cpu", {}))
    inside = links.within(sampler.samples, *found["window"])
    outcome.link_bytes, outcome.link_peak = links.carried(inside), links.peak(inside)
    outcome.link_above = links.above(inside, {h.name: h.rate for h in scene.hosts() if h.rate})
    outcome.link_series = [(sample.middle - found["window"][0], sample.counters) for sample in inside]
    return outcome


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


# -- inside the origin's namespace: the origin, and the scene around it ----------------------------------------------

class Origin:
    """The object's origin: a strong ETag, byte ranges under If-Range, and a count of every body byte sent."""

    def __init__(self, body: bytes, *, names: dict[str, str] | None = None) -> None:
        self.body = body
        self.sent = 0
        self.requests: list[str] = []
        self.log: list[dict] = []  # per request: at (monotonic), by (host name), range, sent
        self._names = names or {}  # address -> host name
        self._t0 = time.monotonic()

    def started(self) -> None:
        """The clients are let go now: `log` times count from here."""
        self._t0 = time.monotonic()

    async def handle(self, request):
        from aiohttp import web

        if request.path != PATH:
            raise web.HTTPNotFound(text=f"no {request.path}\n")
        rng = request.headers.get("Range")
        self.requests.append(rng or request.method)
        entry = {"at": round(time.monotonic() - self._t0, 3),
                 "by": self._names.get(request.remote or "", request.remote), "range": rng or request.method,
                 "sent": 0}
        self.log.append(entry)
        headers = {"ETag": ETAG, "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT", "Accept-Ranges": "bytes",
                   "Cache-Control": "max-age=3600", "Content-Type": "application/octet-stream"}
        first, last, status = 0, len(self.body) - 1, 200
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        if m and request.headers.get("If-Range", ETAG) == ETAG and int(m.group(1)) < len(self.body):
            first, last, status = int(m.group(1)), min(int(m.group(2) or last), last), 206
            headers["Content-Range"] = f"bytes {first}-{last}/{len(self.body)}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = last + 1 - first
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        view = memoryview(self.body)
        with contextlib.suppress(ConnectionError, RuntimeError):
            for at in range(first, last + 1, 256 * 1024):
                piece = view[at:min(at + 256 * 1024, last + 1)]
                await resp.write(piece)
                self.sent += len(piece)
                entry["sent"] += len(piece)
            await resp.write_eof()
        return resp


async def _serve_origin(origin: Origin, host: str):
    """The origin's server on `host`:80, started; its runner, for cleanup."""
    from aiohttp import web

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", origin.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # A small send buffer (inherited by every accepted socket): what the origin counts as sent is then
    # within ~128 KiB of what crossed its link, also for a connection whose reader was killed.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.bind((host, 80))
    await web.SockSite(runner, sock).start()
    return runner


def _start_cluster(scene: Scene, addr: dict, exec_in: dict, work: Path, origin_url: str, redis_url: str, *,
                   procs: list[subprocess.Popen], nodes: dict[str, subprocess.Popen]) -> None:
    """Start Redis and the scene's nodes, each in its namespace; every process
    is added to `procs` as it starts (so the caller stops it whatever follows)
    and each node to `nodes` by name."""
    (work / "redis").mkdir(exist_ok=True)
    procs.append(subprocess.Popen(
        exec_in["redis"] + ["redis-server", "--bind", addr["redis"], "--port", "6379", "--save", "",
                            "--appendonly", "no", "--protected-mode", "no", "--dir", str(work / "redis")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    settings = work / "node-settings.yaml"  # JSON is YAML: --config reads it
    settings.write_text(json.dumps(scene.node_settings(origin_url)))
    token = secrets.token_hex(16)
    for i in range(scene.nodes):
        name, listen = f"node{i}", f"{addr[f'node{i}']}:{NODE_PORT}"
        log = open(work / f"{name}.log", "wb")
        proc = subprocess.Popen(
            exec_in[name] + [sys.executable, "-m", "nezha", "cache", "--config", str(settings), "--listen",
                             listen, "--data-dir", str(work / name), "--redis-url", redis_url, "--node-id",
                             name, "--advertise", listen, "--replicas", str(min(scene.replicas, scene.nodes))],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**_env(), "NEZHA_CLUSTER_TOKEN": token})
        log.close()
        procs.append(proc)
        nodes[name] = proc


def _start_readers(scene: Scene, urls: list[str], exec_in: dict, *,
                   procs: list[subprocess.Popen]) -> list[subprocess.Popen]:
    """One reader process per client group, reading through its node's URL;
    added to `procs` (so the caller stops them whatever follows)."""
    readers = []
    for i, count in enumerate(scene.groups):
        if count:
            readers.append(subprocess.Popen(
                exec_in[f"clients{i}"] + [sys.executable, "-m", "testkit.stampede", "read", urls[i], str(count),
                                          str(i)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=_env(), text=True))
    procs.extend(readers)
    return readers


async def drive(spec_path: Path) -> dict:
    spec = json.loads(spec_path.read_text())
    scene = Scene(**spec["scene"])
    work = Path(spec["work"])
    addr, exec_in = spec["addresses"], spec["exec"]
    body = os.urandom(scene.size)
    digest = hashlib.sha256(body).hexdigest()
    origin = Origin(body, names={address: name for name, address in addr.items()})
    runner = await _serve_origin(origin, addr["origin"])
    origin_url = f"http://{addr['origin']}:80"
    procs: list[subprocess.Popen] = []
    nodes: dict[str, subprocess.Popen] = {}
    owner = killed = None
    try:
        if scene.config == "direct":
            urls = [origin_url] * scene.nodes
        else:
            redis_url = f"redis://{addr['redis']}:6379/0"
            _start_cluster(scene, addr, exec_in, work, origin_url, redis_url, procs=procs, nodes=nodes)
            urls = [f"http://{addr[f'node{i}']}:{NODE_PORT}" for i in range(scene.nodes)]
            owner = await _ring(redis_url, nodes, urls, work)
        readers = _start_readers(scene, urls, exec_in, procs=procs)
        for r in readers:  # every group ready before any starts
            if r.stdout.readline().strip() != "ready":
                raise RuntimeError("a client group did not start")
        before = {name: _cpu_seconds(proc.pid) for name, proc in nodes.items()}
        started_wall, started = time.time(), time.monotonic()
        origin.started()
        for r in readers:
            r.stdin.write(f"{started_wall}\n")
            r.stdin.flush()
        loop = asyncio.get_running_loop()
        reading = asyncio.gather(*(loop.run_in_executor(None, r.communicate) for r in readers))
        if scene.kill_at is not None and owner is not None:
            killed = await _kill_when(origin, nodes[owner], owner, scene, reading)
        outs = await asyncio.wait_for(reading, scene.timeout)
        ended = time.monotonic()
        cpu = {name: round(_cpu_seconds(proc.pid) - before[name], 2) for name, proc in nodes.items()
               if proc.poll() is None}
        clients = [c for out, _ in outs for c in json.loads(out.strip().splitlines()[-1])]
        for c in clients:
            c["exact"] = c["status"] == 200 and c["bytes"] == scene.size and c["sha256"] == digest
        cut = sum(1 for c in clients if killed is not None and c["group"] == int(killed.removeprefix("node"))
                  and not c["exact"])
        return {"clients": clients, "origin_bytes": origin.sent, "origin_requests": origin.requests,
                "origin_log": origin.log,
                "exact": sum(c["exact"] for c in clients), "cut": cut, "owner": owner, "killed": killed,
                "window": [started, ended], "node_cpu": cpu}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        await runner.cleanup()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (`ip netns exec` execs into the node: the same pid)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _ring(redis_url: str, nodes: dict[str, subprocess.Popen], urls: list[str], work: Path) -> str:
    """Write the nodes' ring, wait until each adopts it; the key's first owner."""
    import aiohttp

    from nezha.config import Origin as OriginEntry
    from nezha.index.handle import Index
    from nezha.keys import key_for, parse_target

    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        async def status(url: str) -> dict | None:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                async with s.get(url + "/readyz") as r:
                    return await r.json()
            return None

        for (name, proc), url in zip(nodes.items(), urls):
            while await status(url) is None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (work / f"{name}.log").read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"{name} did not start: {log}")
                await asyncio.sleep(0.1)
        index = Index(redis_url=redis_url, node_id=None)
        await index.start()
        try:
            members = {name: url.removeprefix("http://") for name, url in zip(nodes, urls)}
            epoch = await index.set_membership(members)
            membership = await index.get_membership()
        finally:
            await index.close()
        for url in urls:
            while (st := await status(url)) is None or st.get("ring_epoch") != epoch:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not adopt ring epoch {epoch}: {st}")
                await asyncio.sleep(0.05)
    key = key_for(parse_target(PATH, HOST), OriginEntry(host=HOST, upstream="http://unused"))
    return membership.ring().owners(key, 1)[0]


async def _kill_when(origin: Origin, proc: subprocess.Popen, name: str, scene: Scene,
                     reading: asyncio.Future) -> str | None:
    """SIGKILL `proc` once the origin has sent `kill_at` of the object; None if the clients finished first."""
    assert scene.kill_at is not None
    deadline = time.monotonic() + scene.timeout
    while origin.sent < scene.kill_at * scene.size:
        if reading.done() or time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    return name


# -- inside a client group's namespace: K/N clients reading at once -----------------------------------------------

async def read(url: str, count: int, group: int) -> list[dict]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as s:
        print("ready", flush=True)
        start = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
        cpu0 = time.process_time()

        async def one() -> dict:
            digest, got, first, label, status = hashlib.sha256(), 0, None, "", 0
            try:
                async with s.get(url + PATH, headers={"Host": HOST}) as r:
                    status, label = r.status, r.headers.get("X-Nezha-Cache", "")
                    async for data in r.content.iter_chunked(256 * 1024):
                        if first is None:
                            first = time.time() - start
                        digest.update(data)
                        got += len(data)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                label = f"{label} broken: {type(e).__name__}"
            return {"group": group, "status": status, "bytes": got, "sha256": digest.hexdigest(),
                    "first": first, "last": time.time() - start, "label": label}

        got = list(await asyncio.gather(*(one() for _ in range(count))))
        cpu = time.process_time() - cpu0  # the group's process from the release: all its clients, reading and hashing
        return [{**c, "group_cpu": cpu} for c in got]


def main() -> None:
    parser = argparse.ArgumentParser(description="a stampede scene's parts (run by testkit.stampede.run)")
    sub = parser.add_subparsers(dest="part", required=True)
    d = sub.add_parser("drive")
    d.add_argument("spec", type=Path)
    r = sub.add_parser("read")
    r.add_argument("url")
    r.add_argument("count", type=int)
    r.add_argument("group", type=int)
    a = parser.parse_args()
    if a.part == "drive":
        print(json.dumps(asyncio.run(drive(a.spec))))
    else:
        print(json.dumps(asyncio.run(read(a.url, a.count, a.group))))


if __name__ == "__main__":
    main()
