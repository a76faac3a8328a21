"""Two controllers, one writer: a Lease elects it, a fence in Redis makes a deposed one harmless."""

from __future__ import annotations

import asyncio
import time

from kubernetes_asyncio import client

from nezha.index.membership import Deposed, Fence
from testkit.waits import START_GUARD
from tests.integration.controller.conftest import dns, ring_becomes

FAST = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.2}


async def holder(kube, ns: str) -> tuple[str | None, int]:
    lease = await client.CoordinationV1Api(kube).read_namespaced_lease("nezha-controller", ns)
    return lease.spec.holder_identity, lease.spec.lease_transitions or 0


async def until_leader(*controllers, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [c for c in controllers if c.leading]
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len([c for c in controllers if c.leading])} leaders after {timeout} s")


async def test_two_controllers_one_holds_the_lease_and_only_it_writes(cluster, run_controller, index, kube, ns):
    await cluster.create(2)
    await cluster.add_pod(0)
    a = await run_controller(elected=True, identity="controller-a", **FAST)
    b = await run_controller(elected=True, identity="controller-b", **FAST)
    leader = await until_leader(a, b)
    standby = b if leader is a else a
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)})
    await cluster.add_pod(1)
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)})
    await asyncio.sleep(0.5)
    assert (await holder(kube, ns))[0] == leader.settings.identity
    assert standby.writes == 0 and leader.writes == 2 and not standby.leading
    assert standby.elector.attempts > 1, "the standby keeps trying the Lease"


async def test_the_standby_takes_over_when_the_leader_dies_and_acts(cluster, run_controller, index, kube, ns):
    """The leader's task is cancelled, as SIGKILL would end it: the Lease is not released. The standby takes
    it once lease_duration passed without a renewal (its acquireTime no sooner than that after the last one),
    and writes the next ring change; the seconds that took on a loaded machine are not what is checked."""
    await cluster.create(3)
    await cluster.add_pod(0)
    a = await run_controller(elected=True, identity="controller-a", **FAST)
    await until_leader(a)
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)})
    b = await run_controller(elected=True, identity="controller-b", **FAST)
    await asyncio.sleep(0.5)
    assert not b.leading
    _kill(a)
    last = (await client.CoordinationV1Api(kube).read_namespaced_lease("nezha-controller", ns)).spec
    assert last.holder_identity == "controller-a"
    await cluster.add_pod(1)  # only a live leader can write this
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)}, timeout=START_GUARD)
    assert b.leading
    assert await holder(kube, ns) == ("controller-b", 1)
    taken = (await client.CoordinationV1Api(kube).read_namespaced_lease("nezha-controller", ns)).spec
    assert (taken.acquire_time - last.renew_time).total_seconds() >= last.lease_duration_seconds, \
        "taken once the Lease ran out, not before"


async def test_a_deposed_leader_cannot_write_the_ring_even_late(index, redis_server):
    """The fence, not the timing, keeps it out: a paused leader that wakes after its successor claimed."""
    old, new = Fence(generation=3, holder="controller-a"), Fence(generation=4, holder="controller-b")
    assert await index.claim_fence(old) is None
    await index.set_membership({"n0": "127.0.0.1:1"}, fence=old)
    assert await index.claim_fence(new) is None
    try:
        await index.set_membership({"n0": "127.0.0.1:2"}, fence=old)
    except Deposed as e:
        assert "controller-b" in str(e)
    else:
        raise AssertionError("a deposed leader wrote the ring")
    assert await index.claim_fence(old) == new, "nor can it claim the fence back"
    assert dict((await index.get_membership()).nodes) == {"n0": "127.0.0.1:1"}


def _kill(controller) -> None:
    """End a controller without a goodbye, as SIGKILL does: its Lease stays held until it expires."""
    controller.test_task.cancel()
