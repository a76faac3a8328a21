"""kubectl scale 5 -> 2 as Kubernetes does it, on real node processes: nothing cached is lost.

The ring drops the leaving nodes (as the controller does when replicas
drop) and each gets SIGTERM at about the same moment, in either order.
A node out of the ring hands its objects to their owners before it exits;
a node still in the ring (a restart) exits at once and keeps its disk.

Kubernetes kills a pod after its grace period. That a node keeps within
it is what its log and drain record say ended its waits (the hand-off
finished, not cut by `shutdown_grace`; the wait for the ring ran out its
`leave_settle`), not a clock a loaded machine outruns: `terminate` kills
only a node that hangs.
"""

from __future__ import annotations

import asyncio

import aiohttp

from nezha.wire import DrainOutcome
from testkit.logs import log_events
from tests.integration.cluster.conftest import fetch, terminate
from tests.integration.cluster.test_cluster_processes import cached_cluster

LEAVE_SETTLE = 2.0  # as in Kubernetes: the seconds a node given SIGTERM waits for a ring without it


async def test_scale_from_five_to_two_loses_nothing_cached(origin, start_cluster, redis_server):
    cluster, paths, _ = await cached_cluster(origin, start_cluster, redis_server, "scale", 40, nodes=5,
                                             leave_settle=LEAVE_SETTLE)
    fetched = sum(origin.requests.values())
    remaining = {k: v for k, v in cluster.members().items() if k in ("node-0", "node-1")}
    gone = ("node-2", "node-3", "node-4")
    leaving = [cluster.nodes[nid] for nid in gone]
    # SIGTERM reaches node-4 a moment before the ring that drops it: it waits for that ring.
    exits = [asyncio.get_running_loop().create_task(terminate(leaving[-1]))]
    await cluster.publish(remaining, leaving=set(gone))
    exits += [asyncio.get_running_loop().create_task(terminate(n)) for n in leaving[:-1]]
    await asyncio.gather(*exits)
    assert all(n.proc.returncode == 0 for n in leaving), [n.proc.returncode for n in leaving]
    for nid in gone:
        log = cluster.data_dir / f"{nid}.log"
        # node-4's wait for the ring ended by that ring, naming it leaving, not by its leave_settle timer.
        assert [e["handoff"] for e in log_events(log, "node_leaving")] == [True], nid
        # Every leaving node finished its hand-off within the grace period: it ended by finishing, not
        # by the shutdown_grace timer (`handoff_unfinished`, a drain "timed out").
        finished = log_events(log, "handoff_finished")
        assert finished and finished[-1]["failed"] == 0, (nid, finished)
        assert log_events(log, "handoff_unfinished") == [], nid
        drain = await cluster.index.read_drain(nid)
        assert drain is not None and drain["outcome"] == DrainOutcome.HANDED_OFF, (nid, drain)
    async with aiohttp.ClientSession() as s:
        for url in (cluster.nodes["node-0"].url, cluster.nodes["node-1"].url):
            for p in paths:
                status, _, body = await fetch(s, url, p)
                assert status == 200 and body == p.encode() * 1000
    assert sum(origin.requests.values()) == fetched, "not one origin fetch after the scale-down"


async def test_a_node_still_in_the_ring_exits_promptly_and_keeps_its_disk(origin, start_cluster, redis_server):
    cluster, paths, _ = await cached_cluster(origin, start_cluster, redis_server, "restart", 10, nodes=3,
                                             leave_settle=LEAVE_SETTLE)
    node = cluster.nodes["node-2"]
    held = [p for p in node.data_dir.rglob("*") if p.suffix in (".data", ".obj")]
    assert held
    await terminate(node)
    assert node.proc.returncode == 0, "it exited by itself"
    assert [p for p in node.data_dir.rglob("*") if p.suffix in (".data", ".obj")] == held
    log = cluster.data_dir / "node-2.log"
    # Promptly: its one wait on the way out, for a ring without it, ended by the ring still holding it
    # when its timer of leave_settle ran out (not shutdown_grace's), and no hand-off followed.
    [leaving] = log_events(log, "node_leaving")
    assert leaving["reason"] == "not leaving for good: a restart keeps its disk", leaving
    assert (leaving["handoff"], leaving["in_ring"], leaving["settle_seconds"]) == (False, True, LEAVE_SETTLE)
    assert log_events(log, "handoff_started") == []
