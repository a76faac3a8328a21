"""A cache StatefulSet in the API double, its pods made by the test as the StatefulSet controller would,
a real redis-server, and the controller running in-process."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes_asyncio import client

from cachenode.app import build_node
from cachenode.front.listener import Listener
from nezha.config import CacheSettings, ControllerSettings, Origin
from nezha.index.handle import Index
from nezha.index.connection import IndexUnavailable
from controller.run import Controller
from testkit.kubeapi.fixtures import kube, kube_api, kube_target, ns  # noqa: F401  (fixtures)
from tests.support_kubectl import Kubectl

STS = "nezha-cache"
STOP_WAIT = 30.0  # seconds a cancelled controller may take to stop before its teardown fails
LABELS = {"app.kubernetes.io/name": "nezha-cache"}


def statefulset(replicas: int = 3) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": STS},
        "spec": {
            "replicas": replicas,
            "serviceName": "nezha-cache-peers",
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {"terminationGracePeriodSeconds": 30,
                         "containers": [{"name": "cache", "image": "nezha:test",
                                         "ports": [{"name": "http", "containerPort": 8080}]}]},
            },
        },
    }


def pod(ordinal: int) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{STS}-{ordinal}", "labels": {**LABELS,
                                                           "apps.kubernetes.io/pod-index": str(ordinal)}},
        "spec": {"containers": [{"name": "cache", "image": "nezha:test",
                                 "ports": [{"name": "http", "containerPort": 8080}]}]},
    }


class Cluster:
    """What the StatefulSet controller and the kubelet would do, done by hand."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.ns = namespace

    async def create(self, replicas: int = 3) -> None:
        await self.apps.create_namespaced_stateful_set(self.ns, statefulset(replicas))

    async def add_pod(self, ordinal: int, *, ready: bool = True, ip: str | None = None) -> None:
        await self.core.create_namespaced_pod(self.ns, pod(ordinal))
        await self.set_ready(ordinal, ready, ip=ip or f"127.0.0.{11 + ordinal}")

    async def set_ready(self, ordinal: int, ready: bool, *, ip: str | None = None) -> None:
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        if ip is not None:
            status["podIP"] = ip
        await self.core.patch_namespaced_pod_status(f"{STS}-{ordinal}", self.ns, {"status": status})

    async def delete_pod(self, ordinal: int) -> None:
        await self.core.delete_namespaced_pod(f"{STS}-{ordinal}", self.ns)


def _stack_of(task: asyncio.Task) -> list[str]:
    """Where `task` waits, innermost last, down its chain of awaits (Task.get_stack shows only the outer frame)."""
    lines, coro = [], task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None)
        if frame is not None:
            lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None)
    return lines


@pytest.fixture
def kubectl(kube_api, tmp_path, ns):  # noqa: F811
    """The real kubectl, for workloads made as a user makes them."""
    return Kubectl(kube_api.url, tmp_path, ns)


@pytest.fixture
async def cluster(kube, ns):  # noqa: F811
    return Cluster(kube, ns)


@pytest.fixture
async def index(redis_server):
    idx = Index(redis_url=redis_server.url, node_id=None)
    await idx.start()
    try:
        yield idx
    finally:
        await idx.close()


@pytest.fixture
async def run_controller(kube, ns, redis_server):  # noqa: F811
    """Start a controller in this process; returns it. Stopped at teardown."""
    running: list[tuple[Controller, asyncio.Task, Index]] = []

    async def start(*, elected: bool = False, **overrides) -> Controller:
        """`elected`: with a LeaderElector on the Lease, as `nezha controller` runs."""
        from controller.leader import LeaderElector

        overrides.setdefault("identity", "controller-a")
        settings = ControllerSettings(namespace=ns, statefulset=STS, redis_url=redis_server.url, **overrides)
        idx = Index(redis_url=settings.redis_url, node_id=None)
        await idx.start()
        elector = None
        if elected:
            elector = LeaderElector(api=kube, namespace=ns, name=settings.lease_name, identity=settings.holder,
                                    lease_duration=settings.lease_duration, renew_deadline=settings.renew_deadline,
                                    retry_period=settings.retry_period, claim=idx.claim_fence)
        controller = Controller(settings=settings, api=kube, index=idx, elector=elector)
        task = asyncio.get_running_loop().create_task(controller.run())
        controller.test_task = task  # cancelling it ends the controller without releasing anything, as SIGKILL
        running.append((controller, task, idx))
        return controller

    yield start
    for controller, task, idx in running:
        task.cancel()
        # Bounded: pytest-timeout's one alarm may already have fired in the test's call, and a controller
        # that does not stop would then hang the whole run (a killed controller pod must stop).
        done, _ = await asyncio.wait([task], timeout=STOP_WAIT)
        await idx.close()
        if not done:
            stack = "".join(f"\n  {line}" for line in _stack_of(task))
            raise AssertionError(f"controller {controller.settings.holder} still runs {STOP_WAIT} s after its "
                                 f"task was cancelled; it waits at:{stack}")


@pytest.fixture
async def one_node(cluster, ns, redis_server, tmp_path):
    """Start one cache node with `origins` as pod nezha-cache-0 (ready, in the ring once a controller runs)."""
    listeners = []

    async def start(origins: list[Origin], **settings) -> Listener:
        """`settings`: the node's own beyond these (cluster_token, capacity, ...)."""
        node = build_node(CacheSettings(listen="127.0.0.1:0", data_dir=tmp_path / "n0", node_id=f"{STS}-0",
                                        redis_url=redis_server.url, origins=origins, **settings))
        listener = Listener(node)
        await listener.start("127.0.0.1", 0)
        listeners.append(listener)
        await cluster.create(1)
        cache_pod = pod(0)
        cache_pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": listener.port}]
        await cluster.core.create_namespaced_pod(ns, cache_pod)
        await cluster.set_ready(0, True, ip="127.0.0.1")
        return listener

    yield start
    for listener in listeners:
        await listener.close()


@pytest.fixture
async def cache_nodes(cluster, ns, redis_server, tmp_path):
    """Start `count` cache nodes with `origins` as pods nezha-cache-N on 127.0.0.(11+N), one owner a key,
    each ready; returns their listeners (stopped at teardown)."""
    listeners = []

    async def start(count: int, origins: list[Origin], **settings) -> list[Listener]:
        await cluster.create(count)
        for ordinal in range(count):
            node_id = f"{STS}-{ordinal}"
            node = build_node(CacheSettings(listen="127.0.0.1:0", data_dir=tmp_path / node_id, node_id=node_id,
                                            redis_url=redis_server.url, replicas=1, origins=origins, **settings))
            listener = Listener(node)
            await listener.start(f"127.0.0.{11 + ordinal}", 0)
            listeners.append(listener)
            cache_pod = pod(ordinal)
            cache_pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": listener.port}]
            await cluster.core.create_namespaced_pod(ns, cache_pod)
            await cluster.set_ready(ordinal, True, ip=f"127.0.0.{11 + ordinal}")
        return listeners

    yield start
    for listener in listeners:
        await listener.close()


# How long a test waits for the ring to show a change: a wait, not a claim of speed. It is well under the
# controller's 30 s resync (controller/run.py RESYNC), so a change the watch missed still fails the test; how
# fast a change reaches the ring is bench/controller.py's reaction_p99_ms. At 1 s, a 2-core box at load 20
# failed tests before they reached what they prove (ring is None after 1.0 s).
RING_WAIT = 10.0


async def ring_becomes(index: Index, expected: dict[str, str], timeout: float = RING_WAIT) -> float:
    """Seconds until Redis holds exactly `expected` (fails after `timeout`)."""
    started = time.monotonic()
    held = None
    unreadable = ""
    while time.monotonic() - started < timeout:
        try:
            held = await index.get_membership()
        except IndexUnavailable as e:
            # The reader's own pooled connection may be one a restarted Redis
            # closed: that read fails once and the next one reconnects.
            unreadable = f" (last read failed: {e})"
        else:
            if held is not None and dict(held.nodes) == expected:
                return time.monotonic() - started
        await asyncio.sleep(0.01)
    raise AssertionError(f"ring is {held and dict(held.nodes)}, not {expected}, after {timeout} s{unreadable}")


def dns(ordinal: int, ns: str) -> str:
    return f"{STS}-{ordinal}.nezha-cache-peers.{ns}.svc:8080"


async def annotate(cluster: Cluster, annotations: dict[str, str | None]) -> None:
    """Merge `annotations` into the StatefulSet's (None removes one), as `kubectl annotate` does."""
    await cluster.apps.patch_namespaced_stateful_set(STS, cluster.ns, {"metadata": {"annotations": annotations}})


async def events_about(cluster: Cluster, *, reason: str | None = None, timeout: float = 2.0,
                       count: int = 1) -> list:
    """The Events about the StatefulSet (with `reason`), once at least `count` exist."""
    deadline = time.monotonic() + timeout
    while True:
        listed = await cluster.core.list_namespaced_event(cluster.ns)
        found = [e for e in listed.items if e.involved_object.name == STS and (reason is None or e.reason == reason)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.02)
