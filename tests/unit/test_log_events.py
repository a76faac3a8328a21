"""testkit/logs.py: a log read while its process writes it."""

from __future__ import annotations

from testkit.logs import log_events


def test_a_half_written_last_line_waits_for_its_end_and_plain_lines_are_passed_over(tmp_path):
    log = tmp_path / "node.log"
    log.write_text('{"event": "a", "n": 1}\nTraceback (most recent call last):\n{"event": "b"}\n{"event": "a", "n"')
    assert log_events(log) == [{"event": "a", "n": 1}, {"event": "b"}]
    with log.open("a") as f:
        f.write(': 2}\n')
    assert log_events(log, "a") == [{"event": "a", "n": 1}, {"event": "a", "n": 2}]
