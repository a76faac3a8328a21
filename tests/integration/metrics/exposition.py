"""Reading what components export and what docs/metrics.md says they export."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "metrics.md"
# docs/metrics.md's heading of each component's table.
SECTIONS = {"cache": "Cache node", "controller": "Controller", "webhook": "Webhook"}


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name as queried (a counter's with `_total`) -> (type, label names but `le`), from an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        out[name] = (family.type, labels)
    return out


def sample_names(text: str) -> set[str]:
    """Every series name a query can select: `x_total`, `x_seconds_bucket`, `x_seconds_count`, ..."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def documented(component: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, labels) from the table under the component's heading in docs/metrics.md."""
    text = DOC.read_text()
    m = re.search(rf"^## {re.escape(SECTIONS[component])}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"docs/metrics.md has no section {SECTIONS[component]!r}"
    rows = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`nezha_"):
            continue
        name = cells[0].strip("`")
        assert name not in rows, f"docs/metrics.md lists {name} twice under {SECTIONS[component]}"
        rows[name] = (cells[1], frozenset(re.findall(r"`([a-z_]+)`", cells[2])))
    assert rows, f"no metric rows under {SECTIONS[component]!r} in docs/metrics.md"
    return rows
