"""Prefetch benchmark: 10,000 small objects named by one manifest, against a client reading them cold,
and what the prefetch costs another client's warm reads.

    python bench/prefetch.py [--quick] [--objects 10000] [--size 4096] [--latency 0.02] [--fills 16]
                             [--busy-fills N] [--rounds 3] [--live-rounds 5] [--keep]

Runs, all on 127.0.0.1: a real redis-server; the Kubernetes API double
(testkit/kubeapi, in this process) holding the cache StatefulSet and its one
ready pod; one `nezha cache` process; `nezha controller` as its own process
(kubeconfig to the double, the origin table in --config); and an origin
process (this script, `--serve-origin`) that answers each object after
`--latency` seconds (an internet round trip), `Cache-Control: max-age=86400`.
Needs `pip install -e '.[test]'`, redis-server and wrk (Debian).

- prefetch_rate: a client reads `--objects` objects through the node, cold,
  `--fills` at a time (as many as the controller's `--prefetch-fills`):
  objects per second. Then a Job names another set of as many objects, of
  the same size and latency, by one manifest (`nezha.io/prefetch:
  http://data.example/b0/files.txt`): objects per second from creating the
  Job to its last object stored (what a user waits for; the controller's
  `prefetch_done` log line says when its line came back from the node). The
  ratio prefetch / client, in each of `--rounds` rounds (fresh sets each),
  and their median. Target >= 0.9. Also printed: the ratio to the
  PrefetchDone Event seen (the measure before), each round's timeline (Job
  created, seen by the controller, manifest read, first and last object
  stored, Event written) and the origin's requests in flight for each set.
- live_impact: another client (wrk, one thread) reads 200 warm objects, 4 at a time, for
  `--live` seconds alone (hits per second), then while a third set is
  prefetched (from the origin's first request of it), then alone again once that prefetch is done, and so on for
  `--live-rounds` rounds (a fresh set each). Each round's ratio is during /
  the mean of the two alone around it; live_impact is their median.
  Target >= 0.8. The node runs the
  controller's fills behind live requests (cachenode/front/pacing.py):
  `--busy-fills` sets its `--prefetch-busy-fills` (default: the node's, 1).

Last line: `ratios: prefetch_rate=<r> live_impact=<r>`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import WRK, Children, Node, ensure_tool, repo_env  # noqa: E402
from testkit.kubeapi.kubeconfig import kubeconfig  # noqa: E402
from testkit.kubeapi.server import KubeAPI  # noqa: E402
from testkit.ports import free_port  # noqa: E402
from testkit.redis_server import RedisServer  # noqa: E402
from testkit.waits import until_port  # noqa: E402

NS = "bench"
STS = "nezha-cache"
HOST = "data.example"
LABELS = {"app.kubernetes.io/name": "nezha-cache"}
TOKEN = "nezha-bench-prefetch-token"
WARM = 200


# -- the origin, in a process of its own -----------------------------------------------------------

def serve_origin(port: int, size: int, latency: float, objects: int) -> None:
    """`/SET/N.bin` (N < objects) after `latency` seconds; `/SET/files.txt` lists a set's objects;
    `/_bench/SET` says when the set's requests came and how many were in flight (`in_flight`)."""
    spans: dict[str, list[tuple[float, float]]] = {}  # set -> (start, end) of each object's request, wall clock
    asked: dict[str, int] = {}  # set -> requests begun

    async def handle(request: web.Request) -> web.StreamResponse:
        _, name, leaf = request.path.split("/", 2)
        if name == "_bench":
            return web.json_response({"asked": asked.get(leaf, 0), **in_flight(spans.get(leaf, []))})
        if leaf == "files.txt":
            return web.Response(text="".join(f"http://{HOST}/{name}/{i}.bin\n" for i in range(objects)))
        start = time.time()
        asked[name] = asked.get(name, 0) + 1
        await asyncio.sleep(latency)
        body = hashlib.sha256(request.path.encode()).digest() * (size // 32 + 1)
        spans.setdefault(name, []).append((start, time.time()))
        return web.Response(body=body[:size], headers={"Cache-Control": "max-age=86400",
                                                       "ETag": f'"{hashlib.sha1(request.path.encode()).hexdigest()}"'})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def in_flight(spans: list[tuple[float, float]]) -> dict:
    """The origin's view of one set: its first request, its last answer (wall clock), the mean of its
    requests in flight between them, and that mean in each tenth of the time (what fills the node kept
    in flight, and when)."""
    if not spans:
        return {"requests": 0}
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    tenth = max(last - first, 1e-9) / 10
    busy = [0.0] * 10  # request-seconds in each tenth
    for s, e in spans:
        for i in range(int((s - first) / tenth), min(int((e - first) / tenth), 9) + 1):
            lo, hi = first + i * tenth, first + (i + 1) * tenth
            busy[i] += max(0.0, min(e, hi) - max(s, lo))
    return {"requests": len(spans), "first": first, "last": last, "mean": sum(busy) / (last - first),
            "tenths": [round(b / tenth, 1) for b in busy]}


# -- the cluster -----------------------------------------------------------------------------------

def statefulset(port: int) -> dict:
    container = {"name": "cache", "image": "nezha:bench", "ports": [{"name": "http", "containerPort": port}]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": STS},
            "spec": {"replicas": 1, "serviceName": "nezha-cache-peers", "selector": {"matchLabels": LABELS},
                     "template": {"metadata": {"labels": LABELS}, "spec": {"containers": [container]}}}}


def cache_pod(port: int) -> dict:
    container = {"name": "cache", "image": "nezha:bench", "ports": [{"name": "http", "containerPort": port}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{STS}-0", "labels": LABELS},
            "spec": {"containers": [container]}}


def job(name: str, manifest: str) -> dict:
    spec = {"restartPolicy": "Never", "containers": [{"name": "train", "image": "trainer:1", "command": ["true"]}]}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "annotations": {"nezha.io/prefetch": manifest}},
            "spec": {"template": {"spec": spec}}}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used so far; "bench" is this one (the client, the API
    double). Where a phase's time goes on a CPU-bound machine, per process."""
    out = {"bench": time.process_time()}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


async def quiet(pid: int, *, below: float = 0.1, timeout: float = 30.0) -> None:
    """Until the node uses less than `below` of a core over a quarter second: what the last phase left it
    to do (index writes to Redis, group syncs) is not charged to the next one."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        used = cpu_seconds({"node": pid})["node"]
        await asyncio.sleep(0.25)
        if cpu_seconds({"node": pid})["node"] - used < below * 0.25:
            return


def per_object(before: dict[str, float], after: dict[str, float], objects: int) -> str:
    return ", ".join(f"{name} {(after[name] - before[name]) * 1000 / objects:.2f}" for name in before)


async def ring_written(url: str, timeout: float = 30) -> None:
    """Until the controller has written the ring (so the prefetch's time is its own, not its start-up's)."""
    import redis.asyncio as aredis

    from nezha.index.schema import KEY_EPOCH

    r = aredis.from_url(url)
    try:
        deadline = time.perf_counter() + timeout
        while not await r.get(KEY_EPOCH):
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the controller wrote no ring within {timeout:g} s")
            await asyncio.sleep(0.1)
    finally:
        await r.aclose()


async def read_all(session: aiohttp.ClientSession, node: str, paths: list[str], concurrency: int) -> int:
    """GET every path through the node, `concurrency` at a time; the bytes read."""
    queue = iter(paths)
    got = 0

    async def worker() -> None:
        nonlocal got
        for path in queue:
            async with session.get(node + path, headers={"Host": HOST}) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{path}: {r.status} {body[:200]!r}")
                got += len(body)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return got


async def prefetched(core, name: str, timeout: float) -> float:
    """When the Job's PrefetchDone Event appeared (perf_counter), polling every 50 ms. The list is read as
    JSON, not into the client's models: their deserialization cost this process 0.3 ms of CPU per object
    prefetched, CPU the client phase it is compared with does not spend (the machine is CPU-bound)."""
    from kubernetes_asyncio import client

    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        response = await core.list_namespaced_event(NS, _preload_content=False)
        events = json.loads(await response.read())["items"]
        done = [e for e in events if e["involvedObject"].get("name") == name and e.get("reason") == "PrefetchDone"]
        if done:
            if "failed" in done[0]["message"]:
                job = await client.BatchV1Api(core.api_client).read_namespaced_job(name, NS)
                status = json.loads(job.metadata.annotations.get("nezha.io/prefetch-status") or "{}")
                reasons = sorted({f["reason"] for f in status.get("failed", [])})
                raise RuntimeError(f"{name}: {done[0]['message']}; reasons: {reasons[:5]}")
            return time.perf_counter()
        await asyncio.sleep(0.05)
    raise RuntimeError(f"no PrefetchDone for {name} within {timeout:g} s")


async def origin_view(session, origin: str, name: str) -> dict:
    async with session.get(f"{origin}/_bench/{name}") as r:
        return await r.json()


async def first_request(session, origin: str, name: str, timeout: float = 60) -> None:
    """Until the origin has been asked for the first object of set `name`."""
    deadline = time.perf_counter() + timeout
    while not (await origin_view(session, origin, name)).get("asked"):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the origin was asked nothing of {name} within {timeout:g} s")
        await asyncio.sleep(0.005)


def done_line(log_path: Path, job_name: str) -> dict:
    """The controller's `prefetch_done` line of the Job: when it began following it (wall clock), and the
    seconds from then to the names expanded, the first and last object stored, the end (Event written)."""
    for line in log_path.read_text(errors="replace").splitlines():
        if '"prefetch_done"' in line and f"/{job_name}\"" in line:
            return json.loads(line)
    return {}


def timeline(created: float, done: float, line: dict, seen: dict) -> str:
    """Seconds from the Job's creation to each step of its prefetch."""
    began = line.get("began_at")
    if began is None:
        return "timeline: the controller's prefetch_done line not found"
    steps = [("seen", began)]
    steps += [(k[:-2], began + line[k]) for k in ("expanded_s", "first_ended_s") if k in line]
    if seen.get("requests"):
        steps += [("first origin request", seen["first"]), ("last origin answer", seen["last"])]
    steps += [(k[:-2], began + line[k]) for k in ("last_ended_s", "done_s") if k in line]
    steps.append(("Event seen", done))
    return "timeline (s from the Job's creation): " + ", ".join(f"{k} {t - created:.3f}" for k, t in steps)


def flight(seen: dict) -> str:
    if not seen.get("requests"):
        return "origin: no requests"
    return (f"origin requests in flight: mean {seen['mean']:.1f} over {seen['last'] - seen['first']:.2f} s, "
            f"by tenths {seen['tenths']}")


WARM_LUA = """
n = 0
misses = 0
threads = {}
setup = function(thread) table.insert(threads, thread) end
request = function()
  n = n + 1
  return wrk.format("GET", "/w/" .. (n %% %(warm)d) .. ".bin", {["Host"] = "%(host)s"})
end
response = function(status, headers, body)
  local hit = false
  for k, v in pairs(headers) do
    if string.lower(k) == "x-nezha-cache" and v == "hit" then hit = true end
  end
  if not hit then misses = misses + 1 end
end
done = function(summary, latency, requests)
  local m = 0
  for _, t in ipairs(threads) do m = m + t:get("misses") end
  io.write("not hits: " .. m .. "\\n")
end
"""


async def warm_reader(node: str, seconds: float, script: Path) -> tuple[float, float]:
    """The warm reads of one window, by wrk (one thread, 4 connections): a reader in a process of its own
    that is not the bottleneck. A reader in Python (aiohttp, this script's process, then its own) used
    97 % of a core alone against the node's 78 %, so a window measured the two cores' sharing between
    the reader and the prefetch's other processes (controller, origin, Redis), not what the prefetch took
    from the node's hits. Returns hits per second and the share of a core wrk used."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = await asyncio.create_subprocess_exec(WRK, "-t1", "-c4", f"-d{seconds:g}s", "-s", str(script), node,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out = (await proc.communicate())[0].decode()
    after, took = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - started
    rate, missed = re.search(r"Requests/sec:\s+([\d.]+)", out), re.search(r"not hits: (\d+)", out)
    if proc.returncode != 0 or rate is None or missed is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}):\n{out}")
    if int(missed.group(1)) or "Non-2xx" in out:
        raise RuntimeError(f"a warm read was not a hit:\n{out}")
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return float(rate.group(1)), used / took


async def windowed(node: str, seconds: float, pids: dict[str, int], what: str, script: Path) -> float:
    """One window of warm reads by wrk, with each process's share of a core in it printed."""
    c0, t0 = cpu_seconds(pids), time.perf_counter()
    rate, reader = await warm_reader(node, seconds, script)
    c1, dt = cpu_seconds(pids), time.perf_counter() - t0
    shares = ", ".join(f"{k} {(c1[k] - c0[k]) / dt:.0%}" for k in c1 if k != "bench")
    print(f"  warm reads {what}: {rate:,.0f}/s; a core's share: wrk {reader:.0%}, "
          f"{shares}, this script (the API double) {(c1['bench'] - c0['bench']) / dt:.0%}", flush=True)
    return rate


async def run(args: argparse.Namespace) -> tuple[float, float]:
    from kubernetes_asyncio import client

    work = Path(tempfile.mkdtemp(prefix="nezha-bench-prefetch-"))
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("bench/prefetch.py needs redis-server on PATH (Debian: apt-get install redis-server)")
    redis = RedisServer(exe, work)
    redis.start()
    children = Children()
    api = KubeAPI(bookmark_interval=1.0, validate_pods=False, job_controller=False)
    await api.start()
    kube = api.client()
    try:
        origin_port = free_port()
        origin_proc = await children.spawn(sys.executable, __file__, "--serve-origin", str(origin_port), "--size", str(args.size),
                             "--latency", str(args.latency), "--objects", str(args.objects), env=repo_env())
        origin = f"http://127.0.0.1:{origin_port}"
        await until_port("127.0.0.1", origin_port, timeout=30)
        os.environ["NEZHA_CLUSTER_TOKEN"] = TOKEN
        node = Node(children, work, "node")
        paced = [] if args.busy_fills is None else ["--prefetch-busy-fills", str(args.busy_fills)]
        await node.start(origins={HOST: origin}, args=["--redis-url", redis.url, "--node-id", f"{STS}-0", *paced])
        core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
        await core.create_namespace({"metadata": {"name": NS}})
        await apps.create_namespaced_stateful_set(NS, statefulset(node.port))
        await core.create_namespaced_pod(NS, cache_pod(node.port))
        await core.patch_namespaced_pod_status(f"{STS}-0", NS, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})
        (work / "token").write_text(TOKEN)
        (work / "controller.yaml").write_text(json.dumps({"origins": [{"host": HOST, "upstream": origin}]}))
        log = open(work / "controller.log", "wb")
        controller_proc = await children.spawn(
            sys.executable, "-m", "nezha", "controller", "--namespace", NS, "--statefulset", STS,
            "--redis-url", redis.url, "--identity", "bench", "--peer-address", "pod-ip", "--log-level", "info",
            "--kubeconfig", str(kubeconfig(work / "kubeconfig", api.url)), "--config", str(work / "controller.yaml"),
            "--cluster-token-file", str(work / "token"), "--prefetch-fills", str(args.fills),
            stdout=log, stderr=log, env=repo_env())

        await ring_written(redis.url)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            await read_all(session, node.url, [f"/w/{i}.bin" for i in range(WARM)], 4)
            await node.settled()

            # Rounds of the client reading a set cold, then the prefetch of another set by manifest, each
            # round's ratio from two phases a few seconds apart: on a shared machine the rates drift
            # with the load beside them (a ratio of phases a minute apart ranged 0.53 to 1.44).
            batch = client.BatchV1Api(kube)
            ratios, event_ratios = [], []
            pids = {"node": node.proc.pid, "controller": controller_proc.pid, "origin": origin_proc.pid}
            for k in range(args.rounds):
                await quiet(node.proc.pid)
                started, cpu = time.perf_counter(), cpu_seconds(pids)
                await read_all(session, node.url, [f"/a{k}/{i}.bin" for i in range(args.objects)], args.fills)
                client_rate = args.objects / (time.perf_counter() - started)
                print(f"round {k + 1}: client, cold: {args.objects} objects of {args.size} B, {args.fills} at a "
                      f"time: {client_rate:,.0f} objects/s; CPU ms an object: "
                      f"{per_object(cpu, cpu_seconds(pids), args.objects)}", flush=True)
                print(f"  {flight(await origin_view(session, origin, f'a{k}'))}", flush=True)
                await quiet(node.proc.pid)
                started, cpu, created = time.perf_counter(), cpu_seconds(pids), time.time()
                await batch.create_namespaced_job(NS, job(f"prefetch-b{k}", f"http://{HOST}/b{k}/files.txt"))
                done = await prefetched(core, f"prefetch-b{k}", timeout=args.objects / 5 + 120)
                used = per_object(cpu, cpu_seconds(pids), args.objects)
                line = done_line(work / "controller.log", f"prefetch-b{k}")
                if "last_ended_s" not in line:
                    raise RuntimeError(f"prefetch-b{k}: no prefetch_done line with its times in the controller's log")
                # What a user waits for: from creating the Job to its last object stored (the controller's
                # line for it back from the node). Before, to this script seeing the PrefetchDone Event, which
                # adds the pins, the status, the Event and up to 50 ms of this script's polling: printed too.
                stored = line["began_at"] + line["last_ended_s"] - created
                rate, event_rate = args.objects / stored, args.objects / (done - started)
                ratios.append(rate / client_rate)
                event_ratios.append(event_rate / client_rate)
                print(f"round {k + 1}: prefetch by manifest: {args.objects} objects stored {stored:.2f} s after the "
                      f"Job was created: {rate:,.0f} objects/s; ratio {ratios[-1]:.2f} (to the Event seen, "
                      f"{done - started:.2f} s: {event_rate:,.0f} objects/s, ratio {event_ratios[-1]:.2f}); "
                      f"CPU ms an object: {used}", flush=True)
                seen = await origin_view(session, origin, f"b{k}")
                print(f"  {flight(seen)}", flush=True)
                print(f"  {timeline(created, time.time() - (time.perf_counter() - done), line, seen)}", flush=True)
            print(f"prefetch_rate to the PrefetchDone Event seen (the measure before): "
                  f"{statistics.median(event_ratios):.2f}", flush=True)
            prefetch_ratio = statistics.median(ratios)

            # Rounds of warm reads alone, then during the prefetch of a set c<k> (stopped after `--live`
            # seconds; the prefetch then ends unhindered), each round's ratio taken against the mean of
            # the windows alone just before and just after it, and live_impact their median: a single
            # window of a few seconds each moved with the load beside it by as much as the prefetch's
            # effect (alone 1,766/s before and 927/s after one prefetch of a paired run).
            await quiet(node.proc.pid)
            warm_lua = work / "warm.lua"
            warm_lua.write_text(WARM_LUA % {"warm": WARM, "host": HOST})
            alone = [(await windowed(node.url, args.live, pids, "alone", warm_lua))]
            print(f"warm reads alone: {alone[0]:,.0f}/s", flush=True)
            impacts = []
            for k in range(args.live_rounds):
                await batch.create_namespaced_job(NS, job(f"prefetch-c{k}", f"http://{HOST}/c{k}/files.txt"))
                # The window opens once the prefetch has asked the origin for its first object: opened at the
                # Job's creation, its first tenth of a second or so had no prefetch in it yet.
                await first_request(session, origin, f"c{k}")
                during = await windowed(node.url, args.live, pids, "during", warm_lua)
                await prefetched(core, f"prefetch-c{k}", timeout=args.objects / 5 + 120)
                await quiet(node.proc.pid)
                alone.append(await windowed(node.url, args.live, pids, "alone", warm_lua))
                impacts.append(during / ((alone[-2] + alone[-1]) / 2))
                print(f"live round {k + 1}: warm reads during the prefetch of set c{k}: {during:,.0f}/s, "
                      f"alone after it: {alone[-1]:,.0f}/s; ratio {impacts[-1]:.2f}", flush=True)
            live_impact = statistics.median(impacts)
    finally:
        await children.stop_all()
        await kube.close()
        await api.stop()
        redis.stop()
        if args.keep:
            print(f"kept {work} (the node's and the controller's logs)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return prefetch_ratio, live_impact


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2,000 objects, 3 s of live reads")
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--latency", type=float, default=0.02, help="the origin's seconds per object")
    p.add_argument("--fills", type=int, default=16, help="the controller's --prefetch-fills, and the client's")
    p.add_argument("--busy-fills", type=int, default=None,
                   help="the node's --prefetch-busy-fills: its prefetch fills at a time while live requests come in")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of a client's cold read then a prefetch; prefetch_rate is their median ratio")
    p.add_argument("--live", type=float, default=8.0, help="seconds of warm reads, alone and during a prefetch")
    p.add_argument("--live-rounds", type=int, default=5,
                   help="rounds of warm reads during a prefetch, each between two alone; live_impact is their median")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, the node's data)")
    p.add_argument("--serve-origin", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_origin is not None:
        serve_origin(args.serve_origin, args.size, args.latency, args.objects)
        return
    ensure_tool(WRK, "wrk")
    if args.quick:
        args.objects, args.live = 2_000, 3.0
    rate, impact = asyncio.run(run(args))
    print(f"  prefetch_rate {rate:6.2f}  target >= 0.9   {'met' if rate >= 0.9 else 'NOT met'}")
    print(f"  live_impact   {impact:6.2f}  target >= 0.8   {'met' if impact >= 0.8 else 'NOT met'}")
    print(f"ratios: prefetch_rate={rate:.2f} live_impact={impact:.2f}")


if __name__ == "__main__":
    main()
