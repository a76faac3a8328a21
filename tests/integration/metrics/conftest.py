"""The three components' /metrics, scraped once for the tests of this folder (tests/integration/metrics/components.py)."""

from __future__ import annotations

import pytest_asyncio

from tests.integration.metrics.components import scrape_all


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def exported(tmp_path_factory) -> dict[str, str]:
    """component (cache, controller, webhook) -> the text of its /metrics after a little work."""
    return await scrape_all(tmp_path_factory.mktemp("metrics"))
