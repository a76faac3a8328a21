"""The dashboard's queries, asked of a real Prometheus (Debian's package) scraping a real node under load.

A name check (test_queries_name_real_metrics.py) cannot tell a query that
Prometheus refuses, or one whose labels or arithmetic leave a panel empty.
Here every query of the dashboard and every alert expression must evaluate,
and every panel of the Cluster and Cache nodes rows must have data after a
small load. (The Controller and Webhook rows need a Kubernetes API to have
data; their queries must still evaluate.)
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from testkit.prometheus import Prometheus
from testkit.tools import require_tool
from tests.integration.chart.render import CHART, render
from tests.integration.metrics.components import node_load, origin_and_redis, running_node

DASHBOARD = CHART / "dashboards" / "nezha.json"
NODE_ROWS = ("Cluster", "Cache nodes")


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(row, panel title, PromQL with Grafana's variables filled in as for one namespace, every node)."""
    out, row = [], None
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        if p["type"] == "row":
            row = p["title"]
            continue
        for t in p.get("targets", []):
            expr = (t["expr"].replace("$__rate_interval", "1m").replace("$namespace", "nezha")
                    .replace('pod=~"$node"', 'pod=~".*"'))
            assert "$" not in expr, f"{p['title']}: a variable this test does not fill: {expr}"
            out.append((row, p["title"], expr))
    return out


async def test_every_dashboard_panel_has_data_and_every_alert_evaluates_on_a_real_prometheus(tmp_path):
    exe = require_tool("prometheus")
    async with origin_and_redis(tmp_path) as (origin_url, redis_url):
        async with running_node(tmp_path, redis_url=redis_url, origin_url=origin_url) as base:
            prom = Prometheus(exe, tmp_path, scrape_interval=1.0, targets=[
                (base.removeprefix("http://"), {"namespace": "nezha", "pod": "nezha-cache-0"})])
            await prom.start()
            try:
                async with aiohttp.ClientSession() as session:
                    await prom.scraped(session)  # a scrape before the load: rates start from it
                    await node_load(base)
                    await asyncio.sleep(3.5)  # and scrapes after it
                    rules = _alert_exprs()
                    empty, refused = [], []
                    for row, title, expr in dashboard_targets():
                        try:
                            result = await prom.query(session, expr)
                        except RuntimeError as e:
                            refused.append(f"{title}: {e}")
                            continue
                        if row in NODE_ROWS and not result:
                            empty.append(f"{title}: {expr}")
                    for alert, expr in rules:
                        try:
                            await prom.query(session, expr)
                        except RuntimeError as e:
                            refused.append(f"{alert}: {e}")
                    variables = await prom.query(session, 'nezha_stored_bytes{namespace="nezha"}')
            finally:
                prom.stop()
    assert not refused, "Prometheus refused:\n" + "\n".join(refused)
    assert not empty, "panels without data after the load:\n" + "\n".join(empty)
    assert [r["metric"]["pod"] for r in variables] == ["nezha-cache-0"], "the namespace and node variables' source"


def _alert_exprs() -> list[tuple[str, str]]:
    (rule,) = [o for o in render(sets=["metrics.prometheusRule.enabled=true"]) if o["kind"] == "PrometheusRule"]
    return [(r["alert"], r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]
