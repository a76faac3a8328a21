"""Controller benchmark: reaction time from a pod change to the new ring, and the event rate it keeps up with.

    python bench/controller.py [--quick] [--changes 100] [--events 10000]

Runs the Kubernetes API double (testkit/kubeapi, in this process), a real
redis-server, and `nezha controller` as its own process (so its RSS is its
own), pointed at the double with a kubeconfig. Needs `pip install -e
'.[test]'` and `redis-server` on PATH (Debian package redis-server).

- reaction: `--changes` times, a cache pod's Ready condition is flipped
  through the API (a PATCH of its status, as the kubelet does); the time
  from sending the PATCH to the `nezha:ring:changed` message carrying the
  new epoch, p50 and p99. The reference is the API's own round trip for
  the same PATCH, printed beside it.
- events_per_s: `--events` pod MODIFIED events that change nothing the
  ring depends on (an annotation), fed into the double's watch streams as
  fast as they go, followed by one that does (a pod becomes not ready):
  events / seconds from the first event to that ring write. The controller
  must apply every event in order to see the last one, so this is the rate
  it keeps up with end to end (double, stream, informer, reconcile).
- rss_mb: the controller process's peak RSS over the whole run (psutil,
  sampled every 50 ms).

Last line: `ratios: reaction_p99_ms=<p99> events_per_s=<r> rss_mb=<m>`.
Targets: reaction_p99_ms < 200, events_per_s >= 2000, rss_mb < 150.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio as aredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Sampler  # noqa: E402
from nezha.index.schema import CHANNEL_RING, KEY_EPOCH  # noqa: E402
from testkit.kubeapi.kubeconfig import kubeconfig  # noqa: E402
from testkit.kubeapi.resources import BY_PATH  # noqa: E402
from testkit.kubeapi.server import KubeAPI  # noqa: E402
from testkit.redis_server import RedisServer  # noqa: E402

NS = "nezha"
STS = "nezha-cache"
LABELS = {"app.kubernetes.io/name": "nezha-cache"}
PODS = 5


def statefulset() -> dict:
    container = {"name": "cache", "image": "nezha:bench", "ports": [{"name": "http", "containerPort": 8080}]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": STS},
            "spec": {"replicas": PODS, "serviceName": "nezha-cache-peers", "selector": {"matchLabels": LABELS},
                     "template": {"metadata": {"labels": LABELS}, "spec": {"containers": [container]}}}}


def pod(i: int) -> dict:
    container = {"name": "cache", "image": "nezha:bench", "ports": [{"name": "http", "containerPort": 8080}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{STS}-{i}", "labels": LABELS},
            "spec": {"containers": [container]}}


def ready(flag: bool, i: int) -> dict:
    return {"status": {"phase": "Running", "podIP": f"127.0.0.{11 + i}",
                       "conditions": [{"type": "Ready", "status": "True" if flag else "False"}]}}


class Epochs:
    """Every epoch announced on CHANNEL_RING (`nezha:ring:changed`), with when it arrived."""

    def __init__(self, url: str) -> None:
        self.client = aredis.from_url(url, decode_responses=True)
        self.seen: dict[int, float] = {}
        self.arrived = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        pubsub = self.client.pubsub()
        await pubsub.subscribe(CHANNEL_RING)

        async def listen() -> None:
            async for message in pubsub.listen():
                if message["type"] == "message":
                    self.seen[int(message["data"])] = time.perf_counter()
                    self.arrived.set()

        self._task = asyncio.get_running_loop().create_task(listen())

    async def wait_for(self, epoch: int, timeout: float = 10.0) -> float:
        deadline = time.perf_counter() + timeout
        while epoch not in self.seen:
            self.arrived.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"epoch {epoch} not announced within {timeout} s")
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except asyncio.TimeoutError:
                pass
        return self.seen[epoch]

    async def current(self) -> int:
        return int(await self.client.get(KEY_EPOCH) or 0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.client.aclose()


async def run(args: argparse.Namespace) -> str:
    from kubernetes_asyncio import client

    work = Path(tempfile.mkdtemp(prefix="nezha-bench-controller-"))
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("bench/controller.py needs redis-server on PATH (Debian: apt-get install redis-server)")
    redis = RedisServer(exe, work)
    redis.start()
    api = KubeAPI(bookmark_interval=1.0, validate_pods=False, job_controller=False,
                  history_limit=args.events + 1000)
    await api.start()
    kube = api.client()
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    await core.create_namespace({"metadata": {"name": NS}})
    await apps.create_namespaced_stateful_set(NS, statefulset())
    for i in range(PODS):
        await core.create_namespaced_pod(NS, pod(i))
        await core.patch_namespaced_pod_status(f"{STS}-{i}", NS, ready(True, i))
    epochs = Epochs(redis.url)
    await epochs.start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "controller", "--namespace", NS, "--statefulset", STS,
         "--redis-url", redis.url, "--identity", "bench", "--peer-address", "pod-ip", "--log-level", "warning",
         "--kubeconfig", str(kubeconfig(work / "kubeconfig", api.url))],
        stdout=subprocess.DEVNULL, stderr=open(work / "controller.log", "wb"))
    memory = Sampler(proc.pid, tree=False).start()  # peak RSS every 50 ms, on a thread, until the finally below
    try:
        await epochs.wait_for(1, timeout=20)
        print(f"controller up; ring epoch 1 with {PODS} pods", flush=True)

        # -- reaction: pod readiness flips -----------------------------------------
        reactions, round_trips = [], []
        is_ready = [True] * PODS  # pod 0 stays ready: a ring with no ready pod is not written
        for n in range(args.changes):
            target = 1 + n % (PODS - 1)
            is_ready[target] = not is_ready[target]
            before = await epochs.current()
            sent = time.perf_counter()
            await core.patch_namespaced_pod_status(f"{STS}-{target}", NS, ready(is_ready[target], target))
            round_trips.append((time.perf_counter() - sent) * 1000)
            got = await epochs.wait_for(before + 1)
            reactions.append((got - sent) * 1000)
        q = statistics.quantiles(reactions, n=100)
        p50, p99 = statistics.median(reactions), q[98]
        print(f"reaction over {args.changes} readiness changes: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
              f"(the PATCH's own round trip: p50 {statistics.median(round_trips):.1f} ms)", flush=True)

        # -- event rate: N no-op MODIFIED events, then one that matters -------------
        res = BY_PATH[("", "v1", "pods")]
        stored = api.objects_of("", "pods")[(NS, f"{STS}-0")]
        before = await epochs.current()
        started = time.perf_counter()
        for n in range(args.events):
            stored.setdefault("metadata", {}).setdefault("annotations", {})["bench/n"] = str(n)
            api._bump(stored)
            api._emit(res, "MODIFIED", stored)
            if n % 500 == 0:
                await asyncio.sleep(0)  # let the streams write
        last = api.objects_of("", "pods")[(NS, f"{STS}-1")]
        last["status"] = copy.deepcopy(ready(not _is_ready(last), 1)["status"])
        api._bump(last)
        api._emit(res, "MODIFIED", last)
        got = await epochs.wait_for(before + 1, timeout=120)
        rate = (args.events + 1) / (got - started)
        print(f"{args.events} no-op pod events then one readiness change: ring written after "
              f"{(got - started) * 1000:.0f} ms: {rate:,.0f} events/s", flush=True)
    finally:
        memory.stop()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        await epochs.close()
        await kube.close()
        await api.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    rss = memory.peak / 2**20
    print(f"controller peak RSS {rss:.1f} MiB")
    print(f"  reaction_p99_ms {p99:8.1f}  target < 200   {'met' if p99 < 200 else 'NOT met'}")
    print(f"  events_per_s    {rate:8.0f}  target >= 2000 {'met' if rate >= 2000 else 'NOT met'}")
    print(f"  rss_mb          {rss:8.1f}  target < 150   {'met' if rss < 150 else 'NOT met'}")
    return f"ratios: reaction_p99_ms={p99:.1f} events_per_s={rate:.0f} rss_mb={rss:.1f}"


def _is_ready(pod_obj: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod_obj.get("status") or {}).get("conditions") or [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 changes and 2,000 events")
    ap.add_argument("--changes", type=int, default=None, help="readiness changes for the reaction time (100)")
    ap.add_argument("--events", type=int, default=None, help="no-op pod events for the rate (10000)")
    args = ap.parse_args()
    args.changes = args.changes or (20 if args.quick else 100)
    args.events = args.events or (2000 if args.quick else 10000)
    print(asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
