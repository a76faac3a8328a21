"""The ring in Redis follows the ready cache pods, from watch events, within a second."""

from __future__ import annotations

import asyncio

from tests.integration.controller.conftest import dns, ring_becomes


async def test_ready_pods_become_the_ring_and_a_pod_that_is_not_ready_leaves_it(cluster, run_controller, index, ns):
    await cluster.create(3)
    for i in range(3):
        await cluster.add_pod(i, ready=(i != 2))
    await run_controller()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)})
    await cluster.set_ready(2, True)
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1, 2)})
    await cluster.set_ready(0, False)
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (1, 2)})
    await cluster.delete_pod(1)
    await ring_becomes(index, {"nezha-cache-2": dns(2, ns)})


async def test_pod_ip_addresses_use_the_pods_ip_and_its_http_port(cluster, run_controller, index):
    await cluster.create(2)
    await cluster.add_pod(0, ip="127.0.0.11")
    await cluster.add_pod(1, ip="127.0.0.12")
    await run_controller(peer_address="pod-ip")
    await ring_becomes(index, {"nezha-cache-0": "127.0.0.11:8080", "nezha-cache-1": "127.0.0.12:8080"})


async def test_nothing_changed_writes_nothing_on_relist_or_duplicate_events(cluster, run_controller, index,
                                                                             kube_api, ns):
    await cluster.create(2)
    await cluster.add_pod(0)
    await cluster.add_pod(1)
    controller = await run_controller()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)})
    epoch = (await index.get_membership()).epoch
    kube_api.compact()
    kube_api.drop_watches()  # the resume gets 410: both informers list again and find the same pods
    await cluster.set_ready(1, True)  # the same state written again: an event, no change
    relists = controller.pods.relists
    for _ in range(200):
        if controller.pods.relists > relists:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert controller.pods.relists > relists
    assert (await index.get_membership()).epoch == epoch and controller.writes == 1


async def test_a_change_made_while_the_watch_was_gone_is_found_by_the_relist_after_410(
        cluster, run_controller, index, kube_api, ns):
    await cluster.create(3)
    for i in range(3):
        await cluster.add_pod(i)
    controller = await run_controller()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in range(3)})
    kube_api.stall_watches()  # the streams go silent, as over a half-open connection
    await cluster.set_ready(1, False)  # no stream delivers this event
    kube_api.compact()  # and the history that held it is gone: resuming gets 410
    kube_api.drop_watches()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 2)})
    assert controller.pods.relists >= 2


async def test_a_dropped_watch_connection_is_resumed_and_misses_nothing(cluster, run_controller, index,
                                                                        kube_api, ns):
    await cluster.create(2)
    await cluster.add_pod(0)
    controller = await run_controller()
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)})
    for _ in range(3):
        kube_api.drop_watches(abrupt=True)
        await asyncio.sleep(0.05)
    await cluster.add_pod(1)
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)})
    assert controller.pods.relists == 1, "a resumed watch needs no relist"


async def test_a_ring_lost_from_redis_is_written_again(cluster, run_controller, index, redis_server, ns,
                                                       monkeypatch):
    import controller.run as run

    monkeypatch.setattr(run, "RESYNC", 0.2)
    await cluster.create(1)
    await cluster.add_pod(0)
    await run_controller()
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)})
    import redis.asyncio as aredis

    r = aredis.from_url(redis_server.url)
    await r.flushdb()
    await r.aclose()
    # Nothing changed in the cluster, so only the resync can write the ring again; the wait is RING_WAIT's,
    # a guard (2 s was a speed claim a loaded box could break before ten 0.2 s resyncs ran).
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)})


async def test_the_status_annotation_says_epoch_members_and_leader_and_is_written_only_on_change(
        cluster, run_controller, index, ns):
    import json

    await cluster.create(2)
    await cluster.add_pod(0)
    await cluster.add_pod(1)
    await run_controller(elected=True, identity="controller-a", lease_duration=1.5, renew_deadline=1.0,
                         retry_period=0.2)

    async def status() -> tuple[dict | None, str]:
        sts = await cluster.apps.read_namespaced_stateful_set("nezha-cache", ns)
        text = (sts.metadata.annotations or {}).get("nezha.io/status")
        return (json.loads(text) if text else None), sts.metadata.resource_version

    for _ in range(200):
        got, version = await status()
        if got and got["members"] == ["nezha-cache-0", "nezha-cache-1"]:
            break
        await asyncio.sleep(0.02)
    held = await index.get_membership()
    assert got == {"epoch": held.epoch, "members": ["nezha-cache-0", "nezha-cache-1"], "replicasPerKey": None,
                   "hitRatio": None, "leader": "controller-a"}
    await cluster.set_ready(0, True)  # an event that changes nothing
    await asyncio.sleep(0.4)
    assert (await status())[1] == version, "no write when nothing changed"
    await cluster.set_ready(1, False)
    for _ in range(200):
        got, _ = await status()
        if got["members"] == ["nezha-cache-0"]:
            break
        await asyncio.sleep(0.02)
    assert got["members"] == ["nezha-cache-0"] and got["epoch"] == held.epoch + 1


async def test_a_users_scale_down_takes_the_leaving_pods_out_of_the_ring_within_a_second(
        cluster, run_controller, index, ns):
    await cluster.create(5)
    for i in range(5):
        await cluster.add_pod(i)
    await run_controller()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in range(5)})
    # kubectl scale statefulset nezha-cache --replicas=2: the scale subresource, nothing else.
    await cluster.apps.patch_namespaced_stateful_set_scale("nezha-cache", ns, {"spec": {"replicas": 2}})
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in range(2)})


async def test_a_leaving_node_that_records_no_hand_off_is_a_drain_failed_warning(cluster, run_controller, index,
                                                                                    ns):
    """Killed before it could hand off (or record it): the operator hears that its objects will be refetched."""
    from tests.integration.controller.conftest import events_about

    await cluster.create(3)
    for i in range(3):
        await cluster.add_pod(i)
    controller = await run_controller()
    controller.drains.record_wait = 0.3
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in range(3)})
    await cluster.apps.patch_namespaced_stateful_set_scale("nezha-cache", ns, {"spec": {"replicas": 2}})
    [started] = await events_about(cluster, reason="DrainStarted")
    assert started.message.startswith("nezha-cache-2 left the ring")
    await cluster.delete_pod(2)
    [failed] = await events_about(cluster, reason="DrainFailed", timeout=3.0)
    assert failed.type == "Warning" and "nezha-cache-2" in failed.message and "origin" in failed.message
