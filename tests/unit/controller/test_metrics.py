"""The controller counts the Events it records that an operator alerts on, and no other."""

from __future__ import annotations

from controller.metrics import ControllerMetrics


def test_drain_scale_and_annotation_events_are_counted_by_outcome():
    m = ControllerMetrics()
    for reason in ("DrainStarted", "DrainFailed", "DrainFailed", "ScaledUp", "ScaleClamped", "InvalidAnnotation",
                   "PrefetchDone", "RingWriteFailed"):
        m.event(reason)
    text = m.render().decode()
    assert 'nezha_controller_drains_total{outcome="failed"} 2.0' in text
    assert 'nezha_controller_drains_total{outcome="started"} 1.0' in text
    assert 'nezha_controller_drains_total{outcome="finished"} 0.0' in text
    assert 'nezha_controller_scale_steps_total{direction="up"} 1.0' in text
    assert 'nezha_controller_scale_steps_total{direction="clamped"} 1.0' in text
    assert "nezha_controller_annotation_errors_total 1.0" in text
