"""Every metric the dashboard and the alerts query is one a real component exports.

A renamed metric would otherwise leave a panel empty and an alert silent,
and nothing would say so.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.chart.render import CHART, render
from tests.integration.metrics.exposition import sample_names
from tests.integration.metrics.promql import metric_names, template_query_metric

DASHBOARD = CHART / "dashboards" / "nezha.json"
# Series Prometheus makes itself for every target, not exported by anyone.
PROMETHEUS_OWN = {"up"}


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            metric = template_query_metric(query)
            assert metric, f"variable {v['name']}: not a label_values() query: {query}"
            out.append((f"variable {v['name']}", metric))
    return out


def rule_queries() -> list[tuple[str, str]]:
    (rule,) = [o for o in render(values=[CHART / "ci" / "metrics-values.yaml"]) if o["kind"] == "PrometheusRule"]
    return [(r["alert"], r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]


def test_the_scanner_finds_metrics_and_nothing_else():
    expr = ('sum by (namespace, le) (rate(nezha_a_bucket{job="x", le=~"1|2"}[5m])) / on (pod) group_left '
            'max(nezha_b) > 0.9 and up{job="y"} == 0 or histogram_quantile(0.5, nezha_c_seconds_bucket[$__rate_interval])')
    assert metric_names(expr) == {"nezha_a_bucket", "nezha_b", "up", "nezha_c_seconds_bucket"}


@pytest.mark.asyncio(loop_scope="package")
async def test_every_metric_the_dashboard_and_the_alerts_query_is_exported(exported):
    real = set().union(*(sample_names(text) for text in exported.values())) | PROMETHEUS_OWN
    queries = dashboard_queries() + rule_queries()
    assert len(queries) > 30
    used = set()
    unknown = []
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        used |= names
        unknown += [f"{where}: {n}" for n in sorted(names - real)]
    assert not unknown, "queried but exported by no component:\n" + "\n".join(unknown)
    # Each component's metrics are on the dashboard or in an alert.
    for prefix in ("nezha_controller_", "nezha_webhook_", "nezha_cache_", "nezha_index_up"):
        assert any(n.startswith(prefix) for n in used), prefix
