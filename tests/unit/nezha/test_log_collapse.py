"""Repeated identical log events collapse into one line and a count (nezha/logs.py)."""

from __future__ import annotations

import io
import json

import structlog

from nezha import logs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(window: float = 1.0):
    out, clock = io.StringIO(), Clock()
    logs.configure(stream=out, repeat_window=window, clock=clock)
    return out, clock, structlog.get_logger("test")


def lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]  # every line is one JSON event


def test_a_thousand_identical_events_are_one_line_and_a_count():
    out, clock, log = setup()
    for _ in range(1000):
        log.info("request_completed", method="HEAD", path="/x", status=200, bytes=0)
        clock.now += 0.0001
    log.info("node_stopping")
    got = lines(out)
    assert [e["event"] for e in got] == ["request_completed", "log_repeated", "node_stopping"]
    assert got[1]["repeated_event"] == "request_completed" and got[1]["times"] == 999
    assert got[1]["level"] == "info" and 0 < got[1]["over_s"] < 1


def test_events_that_differ_only_in_timing_collapse_and_those_that_differ_otherwise_do_not():
    out, clock, log = setup()
    log.info("request_completed", path="/a", ms=1.5)
    log.info("request_completed", path="/a", ms=2.5)
    log.info("request_completed", path="/b", ms=2.5)
    log.info("request_completed", path="/b", status=404)
    got = lines(out)
    assert [(e["event"], e.get("path"), e.get("times")) for e in got] == [
        ("request_completed", "/a", None), ("log_repeated", None, 1), ("request_completed", "/b", None),
        ("request_completed", "/b", None)]


def test_after_the_window_a_repeat_is_printed_again_after_the_count_of_those_dropped():
    out, clock, log = setup(window=1.0)
    for _ in range(5):
        log.warning("peer_down", peer="n1")
        clock.now += 0.1
    clock.now += 1.0
    log.warning("peer_down", peer="n1")
    got = lines(out)
    assert [e["event"] for e in got] == ["peer_down", "log_repeated", "peer_down"]
    assert got[1]["times"] == 4 and got[1]["level"] == "warning"


def test_an_event_with_an_exception_is_never_dropped():
    out, clock, log = setup()
    for _ in range(3):
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("fill_crashed", key="k")
    got = lines(out)
    assert [e["event"] for e in got] == ["fill_crashed"] * 3
    assert all("ValueError: boom" in e["exception"] for e in got)


def test_a_pending_count_is_written_by_flush():
    out, clock, log = setup()
    for _ in range(3):
        log.info("tick")
    logs.flush_repeats()
    got = lines(out)
    assert [e["event"] for e in got] == ["tick", "log_repeated"] and got[1]["times"] == 2


def test_configuring_again_starts_from_nothing():
    out, clock, log = setup()
    log.info("tick")
    out2, clock2, log2 = setup()
    log2.info("tick")
    assert [e["event"] for e in lines(out2)] == ["tick"]


def test_the_timestamp_is_structlogs_iso_utc_form_and_follows_each_second():
    times = iter([1_780_000_000.25, 1_780_000_000.5, 1_780_000_001.000001])
    stamp = logs.Timestamp(clock=lambda: next(times))
    got = [stamp(None, "info", {})["timestamp"] for _ in range(3)]
    assert got == ["2026-05-28T20:26:40.250000Z", "2026-05-28T20:26:40.500000Z", "2026-05-28T20:26:41.000001Z"]


def test_events_equal_in_value_but_not_in_type_are_not_one_event():
    out, clock, log = setup()
    log.info("request_completed", status=1)
    log.info("request_completed", status=True)
    log.info("request_completed", status=True, extra=None)
    assert [e.get("times") for e in lines(out)] == [None, None, None]
