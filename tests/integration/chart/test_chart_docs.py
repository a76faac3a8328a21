"""The chart's documentation keeps up with the chart: every value in the README's table, the budgets it
names, and an operations guide.

values.yaml and the Markdown files are read as they are; the budgets are
compared with what the real `helm` renders.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import yaml

from tests.integration.chart.render import find, render

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "nezha"
README = CHART / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"

ROW = re.compile(r"^\| `([^`]+)` \|")


def leaf_keys(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of every leaf: dicts are recursed, anything else (lists, scalars,
    an empty dict) is a leaf."""
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, path)
        else:
            yield path


def values_section(text: str) -> list[str]:
    """The lines of the README's "## Values" section."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "## Values")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1:end]


def documented_keys(text: str) -> list[str]:
    return [m.group(1) for line in values_section(text) if (m := ROW.match(line))]


def test_leaf_keys_treat_lists_and_empty_dicts_as_leaves():
    keys = set(leaf_keys({"a": {"b": 1, "c": {}}, "d": [], "e": [{"f": 1}], "g": {"h": {"i": ""}}}))
    assert keys == {"a.b", "a.c", "d", "e", "g.h.i"}


def test_every_value_of_the_chart_is_in_the_readme_table_and_nothing_else_is():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves = set(leaf_keys(values))
    # A sanity check that the walk saw the shapes it must treat as leaves.
    assert {"origins", "imagePullSecrets", "cache.nodeSelector", "cache.storage.size"} <= leaves
    documented = documented_keys(README.read_text())
    duplicated = sorted({k for k in documented if documented.count(k) > 1})
    assert not duplicated, f"documented more than once in {README.name}: {duplicated}"
    missing = sorted(leaves - set(documented))
    unknown = sorted(set(documented) - leaves)
    assert not missing, f"values without a row in the {README.relative_to(ROOT)} table: {missing}"
    assert not unknown, f"rows in the {README.relative_to(ROOT)} table for values that do not exist: {unknown}"


def test_each_row_has_a_default_and_a_description():
    for line in values_section(README.read_text()):
        if ROW.match(line):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            assert len(cells) == 3 and all(cells), f"a row needs value, default and description: {line}"


def test_the_operations_guide_covers_install_upgrade_and_uninstall_without_losing_disks():
    text = OPERATIONS.read_text()
    for phrase in ("helm install", "helm upgrade", "helm uninstall", "kubectl delete pvc"):
        assert phrase in text, f"{OPERATIONS.relative_to(ROOT)} does not mention {phrase!r}"


def test_the_disruption_budgets_the_readme_names_are_the_ones_the_chart_renders():
    row = next(line for line in README.read_text().splitlines() if line.startswith("| disruption budgets |"))
    named = re.findall(r"`([a-z-]+)` \(`(maxUnavailable|minAvailable): (\d+)`\)", row)
    assert {name for name, _, _ in named} == {"nezha-cache", "nezha-webhook"}, row
    objects = render()
    for name, field, number in named:
        assert find(objects, "PodDisruptionBudget", name)["spec"] == {
            field: int(number), "selector": find(objects, "PodDisruptionBudget", name)["spec"]["selector"]}, name
