"""Leader election on a coordination.k8s.io/v1 Lease, with a fence in Redis.

Two controllers run; exactly one acts. The Lease names the holder
(`holderIdentity`), when it last renewed (`renewTime`), for how long that
counts (`leaseDurationSeconds`) and how many times it changed hands
(`leaseTransitions`). Every write goes through kube-apiserver's optimistic
concurrency (a PUT with the resourceVersion read, 409 when someone else
wrote first), so two candidates can never both take it.

Timing, as client-go's leaderelection (whose defaults these are: lease 15 s,
renew deadline 10 s, retry 2 s):

- a candidate tries every `retry_period`; it takes a Lease whose record has
  not changed for `lease_duration` as observed on its own clock (clocks of
  different machines are never compared);
- the leader renews every `retry_period`; when it has not managed to for
  `renew_deadline` it stops acting, before `lease_duration` lets anyone
  else take the Lease.

client-go says plainly that this gives no fencing: a leader paused (GC,
SIGSTOP, a slow disk) past its lease may wake and write after a successor
did. The one shared write that matters here, the ring, is fenced: a new
leader first claims `nezha:ring:leader` in Redis with its generation
(`leaseTransitions`), and every ring write checks, in the same Redis
transaction, that the fence is still its own (nezha/index/membership.py). A
deposed leader's write is refused, however late it comes. A Lease made anew
(deleted by hand) restarts its count; the new holder then raises the
Lease's `leaseTransitions` above the fence and claims again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Awaitable, Callable

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nezha.index.membership import Fence
from nezha.cancels import stop_if_cancelled

log = structlog.get_logger("nezha.controller.leader")


def _micro_time(at: float | None = None) -> str:
    moment = dt.datetime.fromtimestamp(time.time() if at is None else at, dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, *, api: client.ApiClient, namespace: str, name: str, identity: str,
                 lease_duration: float, renew_deadline: float, retry_period: float,
                 claim: Callable[[Fence], Awaitable[Fence | None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`claim(fence)` makes the fence the ring's (None) or returns the newer one that holds it."""
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(f"leader election needs 0 < retry_period ({retry_period:g}s) < renew_deadline "
                             f"({renew_deadline:g}s) < lease_duration ({lease_duration:g}s)")
        self.api = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self._claim = claim
        self._clock = clock
        self.fence: Fence | None = None  # set while leading
        self.changed = asyncio.Event()  # set whenever leading starts or stops
        self._observed: tuple[str, str | None] | None = None  # (resourceVersion, holder) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self.attempts = 0

    @property
    def leading(self) -> bool:
        """True only while the last renewal is within the renew deadline (checked on every read)."""
        if self.fence is None:
            return False
        if self._clock() - self._renewed_at > self.renew_deadline:
            self.lose("the lease was not renewed within the renew deadline")
            return False
        return True

    def lose(self, why: str) -> None:
        if self.fence is not None:
            log.warning("leadership_lost", identity=self.identity, lease=self.name, reason=why)
            self.fence = None
            self.changed.set()

    async def run(self) -> None:
        """Forever: try to take or renew the Lease every retry period."""
        while True:
            stop_if_cancelled()  # claiming the fence in Redis may have swallowed it (nezha/cancels.py)
            try:
                async with asyncio.timeout(self.retry_period * 2):  # not wait_for: it can swallow a cancel
                    await self.try_once()
            except (ApiException, asyncio.TimeoutError, OSError, ValueError) as e:
                log.warning("lease_attempt_failed", lease=self.name, error=f"{type(e).__name__}: {str(e)[:200]}")
            except Exception as e:  # noqa: BLE001 - an aiohttp error, Redis down: try again next period
                log.warning("lease_attempt_failed", lease=self.name, error=f"{type(e).__name__}: {str(e)[:200]}")
            _ = self.leading  # drops leadership once the renew deadline passed without a renewal
            await asyncio.sleep(self.retry_period)

    async def try_once(self) -> None:
        self.attempts += 1
        try:
            lease = await self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            await self._create()
            return
        spec = lease.spec
        holder = spec.holder_identity if spec else None
        version = lease.metadata.resource_version
        now = self._clock()
        if self._observed != (version, holder):
            self._observed, self._observed_at = (version, holder), now
        transitions = (spec.lease_transitions or 0) if spec else 0
        if holder == self.identity:
            await self._write(lease, transitions=transitions, acquired=False)
            return
        self.lose(f"{holder} holds the lease")
        duration = (spec.lease_duration_seconds if spec and spec.lease_duration_seconds else self.lease_duration)
        if holder and now - self._observed_at < duration:
            return  # held and renewed within its duration, as far as this clock can tell
        await self._write(lease, transitions=transitions + 1, acquired=True)

    async def _create(self) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(transitions=0, acquired=True)}
        try:
            await self.api.create_namespaced_lease(self.namespace, body)
        except ApiException as e:
            if e.status == 409:
                return  # another candidate created it first
            raise
        await self._lead(0)

    def _spec(self, *, transitions: int, acquired: bool, acquire_time: str | None = None) -> dict:
        now = _micro_time()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration)),
                "acquireTime": now if acquired else acquire_time, "renewTime": now,
                "leaseTransitions": transitions}

    async def _write(self, lease, *, transitions: int, acquired: bool) -> None:
        """PUT the Lease as ours (renewed or taken); a 409 means another candidate wrote first."""
        body = self.api.api_client.sanitize_for_serialization(lease)
        acquire_time = body.get("spec", {}).get("acquireTime")
        body["spec"] = self._spec(transitions=transitions, acquired=acquired, acquire_time=acquire_time)
        try:
            await self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as e:
            if e.status == 409:
                self.lose("another candidate wrote the lease first")
                return
            raise
        if acquired or self.fence is None:
            await self._lead(transitions)
        else:
            self._renewed_at = self._clock()

    async def _lead(self, generation: int) -> None:
        """The Lease is ours: claim the ring's fence before acting at all."""
        self._renewed_at = self._clock()
        fence = Fence(generation=generation, holder=self.identity)
        newer = await self._claim(fence)
        if newer is not None:
            # A Lease made anew restarted its count below the fence: raise it
            # above, through the Lease (only its holder can), then claim again.
            log.info("lease_generation_raised", lease=self.name, was=generation, now=newer.generation + 1)
            lease = await self.api.read_namespaced_lease(self.name, self.namespace)
            if (lease.spec.holder_identity if lease.spec else None) != self.identity:
                return
            await self._write(lease, transitions=newer.generation + 1, acquired=True)
            return
        self.fence = fence
        self._renewed_at = self._clock()
        log.info("leadership_acquired", identity=self.identity, lease=self.name, generation=generation)
        self.changed.set()
