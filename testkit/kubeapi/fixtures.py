"""pytest fixtures for the API double; conftest files import them by name.

With `NEZHA_TEST_KUBECONFIG` naming a kubeconfig, `kube` talks to that
cluster instead, so the tests of the double's API surface check it against a
real kube-apiserver. Tests that need the double's own controls (compaction,
dropped watches, webhook addresses, the admission record) take `kube_api`,
which skips them there with the reason.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from testkit.kubeapi.server import KubeAPI

REAL_CLUSTER = os.environ.get("NEZHA_TEST_KUBECONFIG")


@pytest.fixture
async def kube_target():
    """The API double, started; None when the tests run against a real cluster."""
    if REAL_CLUSTER:
        yield None
        return
    api = KubeAPI(bookmark_interval=0.2)
    await api.start()
    try:
        yield api
    finally:
        await api.stop()


@pytest.fixture
def kube_api(kube_target):
    if kube_target is None:
        pytest.skip("needs the API double's controls; NEZHA_TEST_KUBECONFIG names a real cluster")
    return kube_target


@pytest.fixture
async def kube(kube_target):
    """A kubernetes_asyncio ApiClient talking to the double, or to NEZHA_TEST_KUBECONFIG's cluster."""
    if kube_target is None:
        from nezha.kube import api_client

        client = await api_client(kubeconfig=Path(REAL_CLUSTER))
    else:
        client = kube_target.client()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def ns(kube):
    """A fresh namespace for one test, deleted afterwards."""
    from kubernetes_asyncio import client

    name = f"nezha-test-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube)
    await core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        await core.delete_namespace(name)
