"""The leader keeps ConfigMap nezha-ca in every namespace (controller/trust.py), against the API double."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from controller.trust import MANAGED_BY, TrustPublisher
from tests.integration.webhook.registration import namespace

DATA = {"ca.crt": "CERT", "ca-bundle.crt": "ROOTS+CERT", "wgetrc": "ca_certificate = x\n"}


async def until_true(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, "not true in time"
        await asyncio.sleep(0.02)


async def copy_in(core, ns: str):
    try:
        return await core.read_namespaced_config_map("nezha-ca", ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


@pytest.fixture
async def publisher(kube):
    running = []

    async def start(*, leading=lambda: True) -> TrustPublisher:
        p = TrustPublisher(api=kube, namespace="nezha", leading=leading)
        running.append(asyncio.get_running_loop().create_task(p.run()))
        return p

    yield start
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def test_copies_follow_the_source_into_every_namespace_and_come_back_when_deleted(kube, publisher):
    core = client.CoreV1Api(kube)
    for name in ("nezha", "ml"):  # kube-system is there from the start, as in a cluster
        await namespace(kube, name)
    await core.create_namespaced_config_map("nezha", {"metadata": {"name": "nezha-ca"}, "data": DATA})
    await publisher()
    made = await until_true(lambda: copy_in(core, "ml"))
    assert made.data == DATA and made.metadata.labels[MANAGED_BY[0]] == MANAGED_BY[1]
    assert await copy_in(core, "kube-system") is None

    await namespace(kube, "team-b")  # a namespace made later gets its copy
    await until_true(lambda: copy_in(core, "team-b"))

    rotated = {**DATA, "ca.crt": "NEW"}  # the source changes: every copy follows
    await core.patch_namespaced_config_map("nezha-ca", "nezha", {"data": rotated})

    async def follows():
        copies = [await copy_in(core, n) for n in ("ml", "team-b")]
        return all(c is not None and c.data == rotated for c in copies)
    await until_true(follows)

    await core.delete_namespaced_config_map("nezha-ca", "ml")  # deleted by hand: put back
    back = await until_true(lambda: copy_in(core, "ml"))
    assert back.data == rotated


async def test_a_standby_writes_nothing_and_a_users_own_configmap_is_kept(kube, publisher):
    core = client.CoreV1Api(kube)
    for name in ("nezha", "ml", "team-b"):
        await namespace(kube, name)
    await core.create_namespaced_config_map("nezha", {"metadata": {"name": "nezha-ca"}, "data": DATA})
    await core.create_namespaced_config_map("team-b", {"metadata": {"name": "nezha-ca"}, "data": {"mine": "1"}})
    leading = False
    p = await publisher(leading=lambda: leading)
    await asyncio.sleep(0.5)
    assert await copy_in(core, "ml") is None  # not leading: nothing written
    leading = True
    p.wake()
    await until_true(lambda: copy_in(core, "ml"))
    await asyncio.sleep(0.2)
    assert (await copy_in(core, "team-b")).data == {"mine": "1"}
