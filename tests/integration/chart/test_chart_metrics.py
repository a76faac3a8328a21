"""The chart's metrics switches: PodMonitors that scrape each component's real port, the dashboard ConfigMap."""

from __future__ import annotations

import json

from tests.integration.chart.render import CHART, find, render

METRICS_VALUES = CHART / "ci" / "metrics-values.yaml"
DASHBOARD = CHART / "dashboards" / "nezha.json"
MONITORING = ("PodMonitor", "PrometheusRule")


def test_by_default_nothing_of_the_prometheus_operator_or_grafana_is_rendered():
    objects = render()
    assert not [o for o in objects if o["kind"] in MONITORING]
    assert not [o for o in objects if "grafana_dashboard" in (o["metadata"].get("labels") or {})]


def test_each_component_has_a_podmonitor_that_selects_its_pods_and_scrapes_a_port_they_have():
    objects = render(values=[METRICS_VALUES])
    workloads = {"nezha-cache": find(objects, "StatefulSet", "nezha-cache"),
                 "nezha-controller": find(objects, "Deployment", "nezha-controller"),
                 "nezha-webhook": find(objects, "Deployment", "nezha-webhook")}
    monitors = [o for o in objects if o["kind"] == "PodMonitor"]
    assert sorted(m["metadata"]["name"] for m in monitors) == sorted(workloads)
    for monitor in monitors:
        name = monitor["metadata"]["name"]
        template = workloads[name]["spec"]["template"]
        wanted = monitor["spec"]["selector"]["matchLabels"]
        assert wanted.items() <= template["metadata"]["labels"].items(), name
        others = [w for n, w in workloads.items() if n != name]
        assert not any(wanted.items() <= w["spec"]["template"]["metadata"]["labels"].items() for w in others)
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["nezha"]}
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        (container,) = template["spec"]["containers"]
        assert endpoint["port"] in {p["name"] for p in container["ports"]}, name
        assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
        assert {"action": "replace", "targetLabel": "job", "replacement": name} in endpoint["relabelings"]


def test_the_webhook_serves_metrics_on_the_port_its_podmonitor_scrapes():
    (c,) = find(render(), "Deployment", "nezha-webhook")["spec"]["template"]["spec"]["containers"]
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics")
    assert f"--metrics-listen=$(POD_IP):{port}" in c["args"]


def test_the_dashboard_configmap_carries_the_charts_dashboard_for_grafanas_sidecar():
    cm = find(render(values=[METRICS_VALUES]), "ConfigMap", "nezha-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["team"] == "ml-platform"
    assert json.loads(cm["data"]["nezha.json"]) == json.loads(DASHBOARD.read_text())
    moved = find(render(sets=["metrics.dashboard.enabled=true", "metrics.dashboard.namespace=grafana"]),
                 "ConfigMap", "nezha-dashboard")
    assert moved["metadata"]["namespace"] == "grafana"


def test_the_dashboard_has_a_row_per_component_and_namespace_and_node_variables():
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Cache nodes", "Controller", "Webhook"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"namespace", "node"} <= set(variables)
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Hit ratio", "Origin bytes saved", "Throughput served by source", "Requests per node",
            "Stored bytes per node", "Fill latency", "Time to first byte", "Age of what is evicted",
            "Ring members and epoch", "Scale steps and drains", "Prefetched URLs", "Admissions by outcome"} <= titles
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert 'namespace="$namespace"' in target["expr"], (panel["title"], target["expr"])
    node_panels = [p for p in dashboard["panels"] if any('pod=~"$node"' in t["expr"] for t in p.get("targets", []))]
    assert len(node_panels) >= 8
