"""Configuration by annotations on the StatefulSet: a bad value is a Warning Event, never a crash or a change."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.controller.conftest import annotate, dns, events_about, ring_becomes


async def started(cluster, run_controller, index, ns):
    await cluster.create(2)
    await cluster.add_pod(0)
    await cluster.add_pod(1)
    controller = await run_controller()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)})
    return controller


@pytest.mark.parametrize("key,good,bad,field", [
    ("nezha.io/min-replicas", "2", "two", "min_replicas"),
    ("nezha.io/max-replicas", "4", "-4", "max_replicas"),
    ("nezha.io/target-bytes-per-second", "100M", "100m", "target_bytes_per_second"),
    ("nezha.io/scale-down-delay", "120", "-1", "scale_down_delay"),
    ("nezha.io/scale-window", "10", "0", "scale_window"),
    ("nezha.io/scale-cooldown", "30", "soon", "scale_cooldown"),
    ("nezha.io/replicas-per-key", "2", "0", "replicas_per_key"),
    ("nezha.io/autoscale", "false", "yes", "autoscale"),
])
async def test_an_invalid_annotation_is_a_warning_event_naming_it_and_the_last_valid_value_stays(
        cluster, run_controller, index, ns, key, good, bad, field):
    controller = await started(cluster, run_controller, index, ns)
    await annotate(cluster, {key: good})
    for _ in range(100):
        if getattr(controller.spec, field) != getattr(type(controller.spec)(), field):
            break
        await asyncio.sleep(0.01)
    kept = getattr(controller.spec, field)
    await annotate(cluster, {key: bad})
    [warning] = await events_about(cluster, reason="InvalidAnnotation")
    assert warning.type == "Warning" and key in warning.message and bad in warning.message
    assert getattr(controller.spec, field) == kept
    await annotate(cluster, {key: good})
    [fixed] = await events_about(cluster, reason="AnnotationFixed")
    assert fixed.type == "Normal" and key in fixed.message


async def test_min_above_max_names_both_keys_and_keeps_both(cluster, run_controller, index, ns):
    controller = await started(cluster, run_controller, index, ns)
    await annotate(cluster, {"nezha.io/min-replicas": "2", "nezha.io/max-replicas": "5"})
    for _ in range(100):
        if controller.spec.max_replicas == 5:
            break
        await asyncio.sleep(0.01)
    await annotate(cluster, {"nezha.io/min-replicas": "6"})
    [warning] = await events_about(cluster, reason="InvalidAnnotation")
    assert "nezha.io/min-replicas" in warning.message and "nezha.io/max-replicas" in warning.message
    assert (controller.spec.min_replicas, controller.spec.max_replicas) == (2, 5)


async def test_autoscale_without_a_target_is_a_warning_and_stays_off(cluster, run_controller, index, ns):
    controller = await started(cluster, run_controller, index, ns)
    await annotate(cluster, {"nezha.io/autoscale": "true", "nezha.io/max-replicas": "5"})
    [warning] = await events_about(cluster, reason="InvalidAnnotation")
    assert "nezha.io/target-bytes-per-second" in warning.message and controller.spec.autoscale is False


async def test_replicas_per_key_is_published_with_the_ring_and_removed_with_the_annotation(
        cluster, run_controller, index, ns, redis_server):
    import redis.asyncio as aredis

    await started(cluster, run_controller, index, ns)
    r = aredis.from_url(redis_server.url, decode_responses=True)
    try:
        epoch = int(await r.get("nezha:ring:epoch"))
        await annotate(cluster, {"nezha.io/replicas-per-key": "2"})
        for _ in range(100):
            if await r.get("nezha:ring:replicas") == "2":
                break
            await asyncio.sleep(0.01)
        assert await r.get("nezha:ring:replicas") == "2" and int(await r.get("nezha:ring:epoch")) == epoch + 1
        assert (await index.get_membership()).replicas == 2
        await annotate(cluster, {"nezha.io/replicas-per-key": None})
        for _ in range(100):
            if await r.get("nezha:ring:replicas") is None:
                break
            await asyncio.sleep(0.01)
        assert await r.get("nezha:ring:replicas") is None
    finally:
        await r.aclose()
