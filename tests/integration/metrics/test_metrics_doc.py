"""docs/metrics.md lists exactly what each real component exports: names, types and labels."""

from __future__ import annotations

import pytest

from tests.integration.metrics.exposition import documented, families

pytestmark = pytest.mark.asyncio(loop_scope="package")


@pytest.mark.parametrize("component", ["cache", "controller", "webhook"])
async def test_the_doc_lists_every_metric_a_component_exports_and_no_other(exported, component):
    real = {name: v for name, v in families(exported[component]).items() if name.startswith("nezha_")}
    doc = documented(component)
    missing = sorted(set(real) - set(doc))
    extra = sorted(set(doc) - set(real))
    assert not missing, f"exported by the {component} but not in docs/metrics.md: {missing}"
    assert not extra, f"in docs/metrics.md but not exported by the {component}: {extra}"
    wrong = {name: (doc[name], real[name]) for name in real if doc[name] != real[name]}
    assert not wrong, f"type or labels differ, (documented, exported): {wrong}"


async def test_every_component_exports_only_nezha_metrics(exported):
    """Nothing unprefixed (a library's default collectors) slips in beside them."""
    for component, text in exported.items():
        others = sorted(name for name in families(text) if not name.startswith("nezha_"))
        assert not others, f"{component} exports {others}"
