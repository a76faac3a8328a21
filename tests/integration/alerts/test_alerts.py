"""The chart's alerts, proven with the real promtool (Debian's `prometheus` package).

`promtool check rules` on the rules as the chart renders them, and `promtool
test rules` on nezha-alerts.test.yaml: series fed to each alert, which must
fire when it should and resolve when it should, with the labels and the
summary, description and runbook link an operator reads.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit.tools import require_tool
from tests.integration.chart.render import CHART, render

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
UNIT_TESTS = HERE / "nezha-alerts.test.yaml"
ENABLED = ["metrics.prometheusRule.enabled=true"]


def rules_of(objects: list[dict]) -> dict:
    """The rule file a PrometheusRule holds: its spec, `groups:` and all."""
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    return rule["spec"]


def alerts(spec: dict) -> list[dict]:
    return [r for g in spec["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("values", [(), (CHART / "ci" / "metrics-values.yaml",)], ids=["enabled", "ci-values"])
def test_promtool_checks_the_rules_the_chart_renders(values, tmp_path):
    spec = rules_of(render(values=values, sets=ENABLED))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(alerts(spec))} rules found" in run.stdout


def test_each_alert_fires_and_resolves_when_promtool_feeds_it_series(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_of(render(sets=ENABLED)), sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    run = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_every_alert_is_proven_to_fire_and_to_resolve():
    """Each alert has a case where it fires and a later one where it no longer does."""
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    names = {a["alert"] for a in alerts(rules_of(render(sets=ENABLED)))}
    fires, quiet = set(), set()
    for case in tests:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert names - fires == set(), f"never shown firing: {names - fires}"
    assert names - quiet == set(), f"never shown quiet: {names - quiet}"


def test_every_alert_says_what_happened_what_to_look_at_and_links_its_runbook_section():
    headings = re.findall(r"^### (\w+)$", (ROOT / "docs" / "operations.md").read_text(), re.M)
    rule_alerts = alerts(rules_of(render(sets=ENABLED)))
    assert len(rule_alerts) == 10
    for rule in rule_alerts:
        notes = rule["annotations"]
        assert notes["summary"] and len(notes["description"]) > 80, rule["alert"]
        url, _, anchor = notes["runbook_url"].partition("#")
        assert url.endswith("docs/operations.md"), url
        # GitHub's anchor of a heading made of one word is that word, lowercased.
        assert anchor in {h.lower() for h in headings}, f"{rule['alert']}: no section #{anchor} in docs/operations.md"
        assert anchor == rule["alert"].lower()
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_alert_labels_from_values_reach_every_alert_and_the_rule_object_gets_its_labels():
    objects = render(values=[CHART / "ci" / "metrics-values.yaml"])
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert all(a["labels"]["team"] == "ml-platform" for a in alerts(rule["spec"]))


def test_without_the_switch_no_rule_is_rendered():
    assert not [o for o in render() if o["kind"] == "PrometheusRule"]
