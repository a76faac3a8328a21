"""The supervisor's log lines are the lines every other Nezha process writes."""

import io
import json
import re

from cachenode.workers.log_lines import LogLines


def test_a_line_is_one_json_object_with_its_fields_then_event_level_and_an_iso_utc_timestamp():
    out = io.StringIO()
    LogLines("info", stream=out).error("worker_exited", worker=1, code=-9, restart=True)
    (line,) = out.getvalue().splitlines()
    event = json.loads(line)
    assert list(event) == ["worker", "code", "restart", "event", "level", "timestamp"]
    assert event | {"timestamp": None} == {"worker": 1, "code": -9, "restart": True, "event": "worker_exited",
                                           "level": "error", "timestamp": None}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", event["timestamp"])


def test_events_below_the_level_are_not_written_and_an_unknown_level_means_info():
    out = io.StringIO()
    log = LogLines("warning", stream=out)
    log.info("worker_started", worker=0)
    log.warning("w")
    log.level = "loud"
    log.info("i")
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == ["w", "i"]
