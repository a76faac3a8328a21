"""Acting on the autoscaling decision: samples, the scale subresource, Events.

The decision is pure (controller/autoscale.py); this module samples the
nodes' `bytes_served` counters from Redis on the controller's clock, asks
for a decision, and writes a step only through the StatefulSet's `scale`
subresource, with an Event carrying the figures that caused it.

`kubectl scale` is the truth. With autoscaling off the controller never
writes replicas. With it on, a user's count inside [min, max] is simply
where the next decision starts; one outside is clamped to the bound, with
an Event saying so. Only the leader samples or writes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import structlog
from kubernetes_asyncio import client

from nezha.index.connection import IndexUnavailable
from controller.annotations import Spec
from controller.autoscale import LoadHistory, Policy, Sample, decide

if TYPE_CHECKING:
    from controller.events import EventRecorder

log = structlog.get_logger("nezha.controller.scaler")


def policy_of(spec: Spec) -> Policy | None:
    """The autoscale Policy a Spec asks for; None when autoscaling is off."""
    if not spec.autoscale or spec.target_bytes_per_second is None or spec.max_replicas is None:
        return None
    return Policy(min_replicas=spec.min_replicas or 1, max_replicas=spec.max_replicas,
                  target_bytes_per_second=spec.target_bytes_per_second, scale_down_delay=spec.scale_down_delay,
                  scale_window=spec.scale_window, scale_cooldown=spec.scale_cooldown)


class Scaler:
    def __init__(self, *, api: client.ApiClient, namespace: str, name: str, index, events: "EventRecorder",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.apps = client.AppsV1Api(api)
        self.namespace, self.name = namespace, name
        self.index = index
        self.events = events
        self._clock = clock
        self.policy: Policy | None = None
        self.history: LoadHistory | None = None
        self.last_step_at: float | None = None
        self.low_since: float | None = None
        self.steps = 0

    def sample_interval(self) -> float:
        """Often enough for a few samples per window; never busier than 5 a second."""
        window = self.policy.scale_window if self.policy else 30.0
        return max(0.2, min(5.0, window / 6))

    def configure(self, policy: Policy | None) -> None:
        if policy != self.policy:
            self.history = LoadHistory.for_policy(policy) if policy else None
            self.low_since = None
            self.policy = policy

    async def tick(self, *, sts: dict, members: list[str]) -> None:
        """One sample and one decision; a step or a clamp is written through `scale`."""
        if self.policy is None or self.history is None:
            return
        current = (sts.get("spec") or {}).get("replicas")
        if not isinstance(current, int):
            return
        now = self._clock()
        try:
            counters = await self.index.read_node_counters(members)
        except IndexUnavailable as e:
            log.warning("load_not_sampled", error=str(e))
            return
        self.history = self.history.add(Sample(at=now, served=counters))
        lo, hi = self.policy.min_replicas, self.policy.max_replicas
        if not lo <= current <= hi:
            clamped = min(max(current, lo), hi)
            await self._scale(sts, clamped, "ScaleClamped",
                              f"replicas {current} is outside nezha.io/min-replicas {lo} and nezha.io/max-replicas "
                              f"{hi} while autoscaling: set to {clamped}")
            return
        decision = decide(now=now, current=current, ready=len(members), history=self.history, policy=self.policy,
                          last_step_at=self.last_step_at, low_since=self.low_since)
        self.low_since = decision.low_since
        if decision.replicas == current:
            return
        reason = "ScaledUp" if decision.replicas > current else "ScaledDown"
        if await self._scale(sts, decision.replicas, reason, decision.reason):
            self.last_step_at = now
            self.steps += 1

    async def _scale(self, sts: dict, replicas: int, reason: str, message: str) -> bool:
        try:
            await self.apps.patch_namespaced_stateful_set_scale(self.name, self.namespace,
                                                                {"spec": {"replicas": replicas}})
        except Exception as e:  # noqa: BLE001 - a failed step is retried at the next tick
            log.warning("scale_failed", replicas=replicas, error=f"{type(e).__name__}: {str(e)[:200]}")
            return False
        log.info("scaled", replicas=replicas, reason=reason, message=message)
        await self.events.emit(sts, "Normal", reason, message)
        return True
