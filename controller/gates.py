"""Letting go of the pods held until their workload's prefetch is spread (`nezha.io/prefetch-spread: all`).

The webhook creates such a pod with the scheduling gate `nezha.io/prefetch`
(webhook/gate.py: it stays Pending, `SchedulingGated`, and the scheduler
does not look at it). The leader watches the pods labelled
`nezha.io/prefetch-gated` in every namespace and removes the gate (a JSON
patch that first tests the gate is where it was read, so a gate another
controller removed meanwhile is never confused with ours) once:

- the workload's objects are spread: copied to every node
  (controller/prefetch_spread.py);
- or nothing will spread them: the workload is gone, or no longer asks for
  a spread;
- or the pod has waited `--prefetch-gate-wait` (600 s) since it was
  created: a pod is never held forever, whatever happened to the prefetch
  (a listing that hangs, an origin that is down, a controller that lost its
  lead). It is let go with a Warning Event on the pod, saying its first
  reads may go through the objects' owners.

What holds and what lets go is `decide`, pure; a pass over the pods is
level-based, so a gate whose removal failed is removed by a later pass.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Callable

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from controller.events import EventRecorder
from nezha.prefetch.gate import GATE, gate_index, workload_of

log = structlog.get_logger("nezha.controller.gates")

JSON_PATCH = "application/json-patch+json"

# What the controller knows of a workload's spread: it is done; nothing will do it (the workload is gone or
# asks none); it runs or is about to; not known yet (the workloads are not listed yet).
DONE, UNFOLLOWED, SPREADING, UNKNOWN = "done", "unfollowed", "spreading", "unknown"


@dataclass(frozen=True)
class Verdict:
    release: bool
    why: str = ""
    late: bool = False  # let go because it waited its longest, not because the spread is done
    until: float | None = None  # while held: when its wait ends


def decide(*, state: str, created: float | None, now: float, wait: float) -> Verdict:
    """Whether a pod held for a workload in `state`, created at `created` (unix time), is let go `now`."""
    if state == DONE:
        return Verdict(True, "spread")
    if state == UNFOLLOWED:
        return Verdict(True, "nothing spreads for it")
    until = (created if created is not None else now) + wait
    if now >= until:
        return Verdict(True, "waited its longest", late=True)
    return Verdict(False, until=until)


def created_at(pod: dict) -> float | None:
    stamp = (pod.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Gates:
    def __init__(self, *, api: client.ApiClient, events: EventRecorder, wait: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.core = client.CoreV1Api(api)
        self.events = events
        self.wait = wait
        self._clock = clock
        self._opened: set[str] = set()  # uids let go whose watch event has not come back yet
        self.opened = 0  # gates removed, ever (tests, logs)

    async def open(self, pods: dict[str, dict], state: Callable[[str], str]) -> float | None:
        """One pass over the gated pods: let go of each that may go. Returns the seconds until the next
        held pod's wait ends (None: none is held)."""
        now = self._clock()
        next_at: float | None = None
        held_uids = set()
        for pod in list(pods.values()):
            meta = pod.get("metadata") or {}
            index = gate_index(pod)
            if index is None or meta.get("deletionTimestamp"):
                continue
            uid = str(meta.get("uid"))
            held_uids.add(uid)
            if uid in self._opened:
                continue
            workload = workload_of(pod)
            verdict = decide(state=state(workload) if workload else UNFOLLOWED, created=created_at(pod), now=now,
                             wait=self.wait)
            if not verdict.release:
                next_at = verdict.until if next_at is None else min(next_at, verdict.until)
                continue
            if await self._remove(pod, index):
                self._opened.add(uid)
                self.opened += 1
                waited = now - (created_at(pod) or now)
                log.info("prefetch_gate_opened", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                         workload=workload, why=verdict.why, waited=round(waited, 3))
                if verdict.late:
                    await self.events.emit(pod, "Warning", "PrefetchGateTimeout", (
                        f"{GATE}: scheduled after waiting {self.wait:g} s (--prefetch-gate-wait) for the spread of "
                        f"{workload or 'its workload'} (nezha.io/prefetch-spread: all), which is not done: its first "
                        "reads may go through the nodes that own the objects"))
        self._opened &= held_uids  # a pod whose gate is gone (or the pod) is forgotten
        return None if next_at is None else max(0.0, next_at - now)

    async def _remove(self, pod: dict, index: int) -> bool:
        meta = pod.get("metadata") or {}
        patch = [{"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": GATE},
                 {"op": "remove", "path": f"/spec/schedulingGates/{index}"}]
        try:
            await self.core.patch_namespaced_pod(meta["name"], meta["namespace"], patch, _content_type=JSON_PATCH)
            return True
        except ApiException as e:
            # 404: gone; 422: the gates moved since this read (the next watch event brings them); other:
            # the next pass tries again.
            log.warning("prefetch_gate_not_opened", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                        status=e.status, error=str(e.reason)[:200])
        except Exception as e:  # noqa: BLE001 - a timeout, a cut connection: the next pass tries again
            log.warning("prefetch_gate_not_opened", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                        error=f"{type(e).__name__}: {str(e)[:200]}")
        return False
