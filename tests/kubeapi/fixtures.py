"""pytest fixtures for the API double; conftest files import them by name."""

from __future__ import annotations

import pytest

from tests.kubeapi.server import KubeAPI


@pytest.fixture
async def kube_api():
    api = KubeAPI(bookmark_interval=0.2)
    await api.start()
    try:
        yield api
    finally:
        await api.stop()


@pytest.fixture
async def kube(kube_api):
    """A kubernetes_asyncio ApiClient talking to the double."""
    client = kube_api.client()
    try:
        yield client
    finally:
        await client.close()
