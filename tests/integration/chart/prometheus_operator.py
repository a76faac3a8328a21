"""The Prometheus Operator's kinds the chart renders, checked for structure.

kubectl's built-in 1.35 schemas (and kubernetes-validate's) know no custom
resources, and the Operator's CRD documents are in no package registry this
suite installs from. So the fields the chart uses are transcribed here from
the Operator's API reference (monitoring.coreos.com/v1: PodMonitorSpec,
PodMetricsEndpoint, RelabelConfig, PrometheusRuleSpec, RuleGroup, Rule),
with their types, patterns and enums, and every object is closed
(`additionalProperties: false`): a misspelt or misplaced field fails, as
the API server's structural schema would prune it silently. A field the
chart starts to use must be added here first, from that reference. The rule
expressions themselves are checked by promtool (tests/integration/alerts/).

Cross-checked once by hand (not in CI, which would need node): the objects
of ci/metrics-values.yaml pass the validators of the npm package
@kubernetes-models/prometheus-operator 6.0.0, generated from the Operator's
Go types, which check types, enums and patterns but not unknown fields.
"""

from __future__ import annotations

from typing import Any

import jsonschema

# monitoring.coreos.com/v1 Duration.
DURATION = {"type": "string",
            "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": STRINGS,
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["key", "operator"],
        "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "modulus": {"type": "integer"}, "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                        "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                        "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]}}}
METADATA = {"type": "object", "additionalProperties": False, "required": ["name", "namespace"], "properties": {
    "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
    "namespace": {"type": "string"}, "labels": STRINGS, "annotations": STRINGS}}


def _kind(kind: str, spec: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                           "metadata": METADATA, "spec": spec}}


SCHEMAS: dict[str, dict[str, Any]] = {
    "PodMonitor": _kind("PodMonitor", {
        "type": "object", "additionalProperties": False, "required": ["selector"], "properties": {
            "jobLabel": {"type": "string"},
            "selector": LABEL_SELECTOR,
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "podMetricsEndpoints": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "properties": {
                    "port": {"type": "string"}, "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
                    "interval": DURATION, "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
                    "relabelings": {"type": "array", "items": RELABEL},
                    "metricRelabelings": {"type": "array", "items": RELABEL}}}}}}),
    "PrometheusRule": _kind("PrometheusRule", {
        "type": "object", "additionalProperties": False, "properties": {
            "groups": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": DURATION,
                    "rules": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False, "required": ["expr"],
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            "expr": {"type": ["string", "integer"]}, "for": DURATION, "keep_firing_for": DURATION,
                            "labels": STRINGS, "annotations": STRINGS}}}}}}}}),
}


def validate(obj: dict) -> None:
    """Raise jsonschema.ValidationError when `obj` is not what the Operator's v1 API takes."""
    jsonschema.validate(obj, SCHEMAS[obj["kind"]])
