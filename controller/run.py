"""The controller's loop: watch the cache StatefulSet and its pods, keep the ring equal to the ready ones.

Two informers (nezha/informer.py) hold the StatefulSet and the pods its
own `spec.selector` picks. Every change they apply wakes one reconcile
task; changes that arrive within `batch_window` of each other share one
pass. A pass is level-based: it computes the membership from everything
observed (controller/membership.py, pure) and compares it with what Redis
holds, so a relist that finds the same pods, a resync, or a duplicate event
writes nothing, while a Redis that lost its keys is written again.

Failure behaviour: an API server that does not answer, a Redis outage or
an object it cannot read is logged and retried with backoff; the loop
never exits on them. Nodes keep the last ring they had meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import aiohttp
import structlog
from kubernetes_asyncio import client

from nezha.index.handle import Index
from nezha.index.connection import IndexUnavailable
from nezha.index.membership import Deposed
from nezha.index.schema import hit_ratio
from controller import status as status_annotation
from nezha.cancels import stop_if_cancelled
from controller.annotations import DEFAULT, PREFETCH, PREFETCH_SPREAD, Problem, Spec, read_spec, read_spread
from controller.events import EventRecorder
from controller.leader import LeaderElector
from controller.drains import Drains
from controller.membership import leaving, members, pod_selector
from controller.metrics import ControllerMetrics
from controller import workloads
from controller.expand import Expander
from controller.gates import UNFOLLOWED, UNKNOWN, Gates
from controller.prefetch import Prefetcher
from controller.scaler import Scaler, policy_of
from controller.trust import TrustPublisher
from nezha.config import ControllerSettings, parse_hostport
from nezha.errors import ConfigError
from nezha.informer import Informer
from nezha.prefetch.gate import GATED_LABEL

log = structlog.get_logger("nezha.controller")

# Redis is re-read this often even without an API event, so a Redis that
# lost its keys (a restart without persistence) gets the ring back.
RESYNC = 30.0
# /healthz fails once the loop has not gone round for this long: it wakes at
# least every RESYNC seconds, and a failing pass backs off at most 10 s.
STUCK_AFTER = 3 * RESYNC


class Controller:
    def __init__(self, *, settings: ControllerSettings, api: client.ApiClient, index: Index,
                 elector: LeaderElector | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """Without `elector` it acts as if it always led (one replica, tests of one controller)."""
        self.settings = settings
        self.api = api
        self.index = index
        self.elector = elector
        self._clock = clock
        self.namespace = settings.namespace
        self.name = settings.statefulset
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        self._apps = apps
        self._wake = asyncio.Event()
        self.statefulsets = Informer(kind="statefulset", list_fn=apps.list_namespaced_stateful_set,
                                     namespace=self.namespace, field_selector=f"metadata.name={self.name}",
                                     on_change=self._changed)
        self._list_pods = core.list_namespaced_pod
        # Workloads live in their users' namespaces: watched everywhere, for nezha.io/prefetch; the
        # custom kinds (LeaderWorkerSet, JobSet) once discovery finds them (controller/workloads.py).
        self.workloads: dict[str, Informer] = {}
        self._workload_tasks: list[asyncio.Task] = []
        for kind in workloads.KINDS:
            if not kind.custom:
                self._add_workload_kind(kind)
        self.jobs = self.workloads[workloads.JOB.name]
        self._http: aiohttp.ClientSession | None = None
        self.pods: Informer | None = None
        self._pods_task: asyncio.Task | None = None
        # What Redis held after our last read or write: nodes and owners per key.
        self.written: tuple[dict[str, str], int | None] | None = None
        self.writes = 0
        self.status_written_at: float | None = None
        self.failing: str | None = None  # why reconciling fails, while it does (one Warning per outage)
        self.spec: Spec = DEFAULT
        self.problems: dict[tuple[str, ...], Problem] = {}  # reported, by annotation keys
        self.metrics = ControllerMetrics()
        self.events = EventRecorder(api=api, namespace=self.namespace, component="nezha-controller",
                                    host=settings.holder, allowed=lambda: self.leading, counted=self.metrics.event)
        self.scaler = Scaler(api=api, namespace=self.namespace, name=self.name, index=index, events=self.events,
                             clock=clock)
        self.prefetcher = self._prefetcher(settings, api, index)
        # Pods held until their workload's prefetch is spread (webhook/gate.py), in every namespace.
        self.gated = Informer(kind="pod", list_fn=core.list_pod_for_all_namespaces, namespace=None,
                              label_selector=GATED_LABEL, on_change=self._changed)
        self.gates = Gates(api=api, events=self.events, wait=settings.prefetch_gate_wait)
        self._gate_timer: asyncio.TimerHandle | None = None
        self.drains = Drains(events=self.events, index=index,
                             present=lambda node: self.pods is not None and node in self.pods.objects)
        self.trust = TrustPublisher(api=api, namespace=self.namespace, leading=lambda: self.leading) \
            if settings.publish_ca else None
        self.last_event_at: float | None = None
        self.loop_at: float | None = None  # when the reconcile loop last went round (controller/health.py)
        self.metrics.watch(self)

    def _prefetcher(self, settings: ControllerSettings, api: client.ApiClient, index: Index) -> Prefetcher:
        """The prefetch of workloads' datasets: its own dozen settings, and the
        controller's events, metrics, HTTP session and ring it shares."""
        expander = Expander(session=self._session, origins=settings.origin_table, hub_host=settings.hub_host,
                            s3_host=settings.s3_host, max_objects=settings.prefetch_max_objects,
                            s3_page_keys=settings.s3_page_keys)
        return Prefetcher(api=api, events=self.events, session=self._session, ring=self._ring,
                          origins=settings.origin_table, fills=settings.prefetch_fills,
                          expander=expander, cluster_token=settings.cluster_token,
                          s3_region=settings.s3_region, record_pins=index.record_pins,
                          spread_max=settings.prefetch_spread_max, spread_over=self._changed,
                          counted=lambda outcome: self.metrics.prefetches.labels(outcome).inc())

    def loop_idle(self) -> float | None:
        """Seconds since the reconcile loop last went round; None before it started."""
        return None if self.loop_at is None else self._clock() - self.loop_at

    def _changed(self) -> None:
        if self.last_event_at is None:
            self.last_event_at = self._clock()
        self._wake.set()

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    @property
    def statefulset(self) -> dict | None:
        return self.statefulsets.objects.get(self.name)

    async def run(self) -> None:
        """Until cancelled."""
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self.statefulsets.run()), loop.create_task(self._discover_forever()),
                 loop.create_task(self.gated.run())]
        self._workload_tasks = [loop.create_task(i.run()) for i in self.workloads.values()]
        tasks.append(loop.create_task(self._autoscale_forever()))
        if self.trust is not None:
            tasks.append(loop.create_task(self.trust.run()))
        if self.elector is not None:
            tasks += [loop.create_task(self.elector.run()), loop.create_task(self._follow_leadership())]
        try:
            await self._reconcile_forever()
        finally:
            tasks.append(self._pods_task)
            tasks += self._workload_tasks
            for task in tasks:
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
            await self.prefetcher.close()
            await self.drains.close()
            if self._http is not None:
                await self._http.close()

    def _add_workload_kind(self, kind: workloads.Kind) -> Informer:
        informer = self.workloads[kind.name] = Informer(kind=kind.name, list_fn=workloads.list_all(self.api, kind),
                                                        namespace=None, on_change=self._changed)
        return informer

    async def _discover_forever(self) -> None:
        """Watch the custom workload kinds from when discovery finds their CRDs (controller/workloads.py)."""
        while True:
            stop_if_cancelled()
            try:
                found = await workloads.discover(self.api)
            except Exception as e:  # noqa: BLE001 - the API may be away: the next round looks again
                log.warning("workload_discovery_failed", error=f"{type(e).__name__}: {str(e)[:200]}")
                found = set()
            for kind in sorted(found - {workloads.BY_NAME[k] for k in self.workloads}, key=lambda k: k.name):
                log.info("workload_kind_discovered", kind=kind.name, api_version=kind.api_version)
                informer = self._add_workload_kind(kind)
                self._workload_tasks.append(asyncio.get_running_loop().create_task(informer.run()))
            await asyncio.sleep(workloads.REDISCOVER)

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5,
                                                                             sock_read=60))
        return self._http

    def _ring(self):
        held = self.index.membership
        if held is None or not held.nodes:
            return None, {}
        return held.ring(), dict(held.nodes)

    async def _autoscale_forever(self) -> None:
        """Sample and decide while leading with autoscaling on (controller/scaler.py)."""
        while True:
            stop_if_cancelled()  # a Redis read in the last tick may have swallowed it (nezha/cancels.py)
            await asyncio.sleep(self.scaler.sample_interval())
            sts = self.statefulset
            if not self.leading or sts is None or self.written is None:
                continue
            try:
                await self.scaler.tick(sts=sts, members=sorted(self.written[0]))
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad tick
                log.exception("autoscale_failed")

    async def _follow_leadership(self) -> None:
        """A new leader looks at everything afresh: Redis may hold what another wrote."""
        assert self.elector is not None
        while True:
            stop_if_cancelled()
            await self.elector.changed.wait()
            self.elector.changed.clear()
            if not self.elector.leading:
                # A standby writes nothing: stop what the leader had started.
                await self.prefetcher.close()
                await self.drains.close()
            self.written = None
            self.problems = {}
            self._wake.set()
            if self.trust is not None:
                self.trust.wake()

    def _follow_pods(self, selector: str) -> None:
        """Watch the pods `selector` picks; a new selector (the StatefulSet changed it) starts over."""
        if self.pods is not None and self.pods.label_selector == selector:
            return
        if self._pods_task is not None:
            self._pods_task.cancel()
        log.info("pods_followed", statefulset=self.name, selector=selector)
        self.pods = Informer(kind="pod", list_fn=self._list_pods, namespace=self.namespace,
                             label_selector=selector, on_change=self._changed)
        self._pods_task = asyncio.get_running_loop().create_task(self.pods.run())

    async def _reconcile_forever(self) -> None:
        delay = 0.2
        while True:
            stop_if_cancelled()  # a Redis call in the last pass may have swallowed it (nezha/cancels.py)
            self.loop_at = self._clock()
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a
                # cancellation that lands as the event is set, and this loop
                # then outlived SIGTERM (seen as a hung controller in CI runs).
                async with asyncio.timeout(RESYNC):
                    await self._wake.wait()
            except TimeoutError:
                self.written = None  # look at Redis again
            await asyncio.sleep(self.settings.batch_window)
            self._wake.clear()
            started = time.perf_counter()
            try:
                await self.reconcile()
                self._reconciled("ok", started)
                delay = 0.2
                if self.failing is not None and self.statefulset is not None:
                    await self.events.emit(self.statefulset, "Normal", "RingWriteRecovered",
                                           f"the ring is written again after: {self.failing}")
                    self.failing = None
            except Deposed as e:
                self._reconciled("deposed", started)
                log.warning("ring_write_refused", error=str(e))
                if self.elector is not None:
                    self.elector.lose(str(e))
            except Exception as e:  # noqa: BLE001 - Redis down, an object it cannot read: log, back off, go on
                self._reconciled("failed", started)
                if isinstance(e, IndexUnavailable):
                    log.warning("ring_write_failed", error=str(e), retry_in=round(delay, 2))
                else:
                    log.exception("reconcile_failed", retry_in=round(delay, 2))
                if self.failing is None and self.statefulset is not None and self.leading:
                    self.failing = f"{type(e).__name__}: {str(e)[:300]}"
                    await self.events.emit(self.statefulset, "Warning", "RingWriteFailed",
                                           f"cannot keep the ring current, retrying with backoff: {self.failing}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                self._wake.set()

    def _reconciled(self, outcome: str, started: float) -> None:
        """Count and time a pass; only the leader's do work, so a standby's are left out."""
        if self.leading:
            self.metrics.reconciles.labels(outcome).inc()
            self.metrics.reconcile_duration.observe(time.perf_counter() - started)

    async def reconcile(self) -> None:
        """One level-based pass over everything observed; only the leader acts on it. Held pods are
        looked at after it, also when it fails or stops short (no StatefulSet, Redis away): a pod is
        never held longer than --prefetch-gate-wait."""
        if not self.leading:
            return
        try:
            await self._reconcile()
        except Exception:
            await self._open_gates()
            raise
        await self._open_gates()

    async def _open_gates(self) -> None:
        """Let go of the held pods that may go (controller/gates.py); wake again when the next one's wait ends."""
        if not self.gated.synced.is_set():
            return
        after = await self.gates.open(self.gated.objects, self._spread_state)
        if self._gate_timer is not None:
            self._gate_timer.cancel()
        self._gate_timer = None if after is None else \
            asyncio.get_running_loop().call_later(after + 0.01, self._wake.set)

    def _spread_state(self, workload: str) -> str:
        """How far the spread of `workload` ("Kind/ns/name") is, as controller/gates.py reads it."""
        kind, _, key = workload.partition("/")
        informer = self.workloads.get(kind)
        if informer is None or not informer.synced.is_set():
            return UNKNOWN
        annotations = ((informer.objects.get(key) or {}).get("metadata") or {}).get("annotations") or {}
        if not annotations.get(PREFETCH) or not read_spread(annotations.get(PREFETCH_SPREAD))[0]:
            return UNFOLLOWED
        return self.prefetcher.spread_state(workload)

    async def _reconcile(self) -> None:
        sts = self.statefulset
        if sts is None:
            if self.statefulsets.synced.is_set():
                log.warning("statefulset_missing", namespace=self.namespace, statefulset=self.name)
            return
        await self.read_annotations(sts)
        selector = pod_selector(sts)
        if selector is None:
            log.error("statefulset_without_selector", statefulset=self.name)
            return
        self._follow_pods(selector)
        assert self.pods is not None
        if not self.pods.synced.is_set():
            return  # its first list wakes us again
        desired = members(self.pods.objects.values(), statefulset=sts, namespace=self.namespace,
                          peer_address=self.settings.peer_address, peer_port=self.settings.peer_port)
        going = frozenset(n for n, p in self.pods.objects.items() if leaving(p, statefulset=sts))
        await self.write_ring(desired, replicas=self.spec.replicas_per_key, leaving=going)
        await self.write_status(sts)
        self._follow_drains(sts)
        if all(i.synced.is_set() for i in self.workloads.values()):
            self.prefetcher.observe({f"{kind}/{key}": obj for kind, informer in self.workloads.items()
                                     for key, obj in informer.objects.items()})

    def _follow_drains(self, sts: dict) -> None:
        """Events for the nodes a scale-down takes out of the ring while they still run (controller/drains.py)."""
        assert self.pods is not None
        going = [name for name, pod in self.pods.objects.items() if leaving(pod, statefulset=sts)]
        self.drains.observe(sts=sts, leaving=going)

    async def write_status(self, sts: dict) -> None:
        """The `nezha.io/status` annotation, when what it says changed (controller/status.py)."""
        if self.written is None:
            return
        held = self.index.membership
        try:
            ratio = hit_ratio(await self.index.read_cluster_stats())
        except IndexUnavailable:
            ratio = None
        new = status_annotation.build(epoch=held.epoch if held else None, members=list(self.written[0]),
                                      replicas_per_key=self.written[1], hit_ratio=ratio, leader=self.settings.holder)
        current = ((sts.get("metadata") or {}).get("annotations") or {}).get(status_annotation.KEY)
        now = self._clock()
        if not status_annotation.should_write(current, new, now=now, last_write_at=self.status_written_at):
            return
        try:
            await self._apps.patch_namespaced_stateful_set(
                self.name, self.namespace,
                {"metadata": {"annotations": {status_annotation.KEY: status_annotation.render(new)}}})
            self.status_written_at = now
        except Exception as e:  # noqa: BLE001 - a status is never worth the controller; the next pass retries
            log.warning("status_not_written", error=f"{type(e).__name__}: {str(e)[:200]}")

    async def read_annotations(self, sts: dict) -> None:
        """The StatefulSet's nezha.io/* annotations -> self.spec; a Warning Event
        for each new problem (the last valid value stays in force), a Normal
        Event when one is fixed."""
        annotations = (sts.get("metadata") or {}).get("annotations") or {}
        spec, problems = read_spec(annotations, last=self.spec)
        now = {p.keys: p for p in problems}
        for keys, problem in now.items():
            if self.problems.get(keys) != problem:
                log.warning("annotation_invalid", keys=list(keys), value=problem.value[:200], message=problem.message)
                await self.events.emit(sts, "Warning", "InvalidAnnotation", problem.message)
        for keys in self.problems.keys() - now.keys():
            shown = ", ".join(f"{k}={annotations[k]!r}" if k in annotations else f"{k} (removed)" for k in keys)
            log.info("annotation_fixed", keys=list(keys))
            await self.events.emit(sts, "Normal", "AnnotationFixed", f"fixed: {shown}; in force now")
        self.problems = now
        if spec != self.spec:
            log.info("spec_changed", spec=spec.__dict__)
        self.spec = spec
        self.scaler.configure(policy_of(spec))

    async def write_ring(self, desired: dict[str, str], *, replicas: int | None = None,
                         leaving: frozenset[str] = frozenset()) -> None:
        """Write `desired` (with the owners per key, and the nodes a scale-down
        took out, which hand off on SIGTERM) unless Redis already holds exactly it."""
        if self.written is None:
            held = await self.index.get_membership()
            self.written = (dict(held.nodes), held.replicas, held.leaving) if held is not None else None
        if (desired, replicas, leaving) == self.written:
            self.last_event_at = None
            return
        if not desired:
            # No pod can serve: nodes keep the ring they have rather than each
            # owning every key; the first ready pod gets a ring again.
            log.warning("ring_kept_without_ready_pods", statefulset=self.name,
                        kept=sorted(self.written[0]) if self.written else [])
            self.last_event_at = None
            return
        fence = self.elector.fence if self.elector is not None else None
        if self.elector is not None and fence is None:
            return  # lost the lease since the pass began
        epoch = await self.index.set_membership(desired, replicas=replicas, fence=fence, leaving=leaving)
        self.written = (dict(desired), replicas, leaving)
        self.writes += 1
        self.metrics.ring_writes.inc()
        waited = None if self.last_event_at is None else round((self._clock() - self.last_event_at) * 1000, 1)
        self.last_event_at = None
        log.info("ring_updated", epoch=epoch, members=sorted(desired), replicas_per_key=replicas,
                 ms_since_event=waited)


async def run_controller(settings: ControllerSettings, *, stop: asyncio.Event | None = None,
                         api: Any = None) -> None:
    """`nezha controller`: reach the API and Redis (retrying), then run until SIGINT/SIGTERM or `stop`."""
    from nezha.kube import api_client
    from nezha.lifecycle import stop_on_signals

    own_api = api is None
    if own_api:
        api = await api_client(kubeconfig=settings.kubeconfig,
                               hint="pass --kubeconfig (or set KUBECONFIG)")
    index = Index(redis_url=settings.redis_url, node_id=None)
    try:
        await index.start()
    except ConfigError:
        if own_api:
            await api.close()
        raise
    elector = LeaderElector(api=api, namespace=settings.namespace, name=settings.lease_name,
                            identity=settings.holder, lease_duration=settings.lease_duration,
                            renew_deadline=settings.renew_deadline, retry_period=settings.retry_period,
                            claim=index.claim_fence)
    controller = Controller(settings=settings, api=api, index=index, elector=elector)
    stop = stop_on_signals(stop)
    log.info("controller_started", namespace=settings.namespace, statefulset=settings.statefulset,
             identity=settings.holder, peer_address=settings.peer_address)
    task = asyncio.get_running_loop().create_task(controller.run())
    health = None
    try:
        if settings.health_listen is not None:
            from controller import health as health_server
            health = await health_server.start(controller, parse_hostport(settings.health_listen, field="health_listen"),
                                               stuck_after=STUCK_AFTER)
        await stop.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if health is not None:
            await health.cleanup()
        await index.close()
        if own_api:
            await api.close()
        log.info("controller_stopped")
