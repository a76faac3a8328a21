"""The metric names a PromQL expression selects, by a small scanner rather than a parser.

Label matchers (`{...}`), ranges (`[5m]`), grouping clauses (`by (...)`,
`on (...)`, ...) and strings are removed first; what is left that looks like
an identifier and is neither a function call, a keyword nor a number is a
metric name. Enough for the expressions the chart ships; a test of its own
(test_queries_name_real_metrics.py) keeps it honest.
"""

from __future__ import annotations

import re

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
            "group_right", "inf", "nan", "atan2"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?")


def metric_names(expr: str) -> set[str]:
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def template_query_metric(query: str) -> str | None:
    """The metric of a Grafana `label_values(metric{...}, label)` variable query."""
    m = re.match(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", query)
    return m.group(1) if m else None
