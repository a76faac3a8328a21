"""What `nezha up` says about its nodes before and after they start (nezha/dev/local_cluster.py)."""

import json

import pytest

from nezha.dev.local_cluster import last_words, port_overlap


def event(name: str, level: str = "info", **fields) -> str:
    return json.dumps({**fields, "event": name, "level": level, "timestamp": "2026-11-27T05:00:00.000000Z"})


def test_a_node_that_died_after_an_ordinary_line_is_not_blamed_on_that_line(tmp_path):
    """Killed with -9, a node logs nothing about it: its last line is a request, not the cause."""
    log = tmp_path / "node-1.log"
    log.write_text(event("node_listening") + "\n" + event("request_completed", status=200) + "\n")
    assert last_words(log) == "no error logged; its last line: " + event("request_completed", status=200)


@pytest.mark.parametrize("line", [
    "nezha cache: cannot listen on 127.0.0.1:18181 (--listen): address already in use",
    "RuntimeError: boom",
    event("store_open_failed", level="error", path="/d"),
    event("crashed", level="critical"),
])
def test_an_error_line_is_given_as_it_is(tmp_path, line):
    log = tmp_path / "node-0.log"
    log.write_text(event("node_starting") + "\n" + line + "\n\n")
    assert last_words(log) == line


def test_an_empty_or_missing_log_says_so(tmp_path):
    (tmp_path / "empty.log").write_text("")
    assert last_words(tmp_path / "empty.log") == "(nothing logged)"
    assert last_words(tmp_path / "absent.log") == "(no log)"


def test_overlapping_http_and_tls_port_ranges_are_named_with_the_port_both_would_take():
    assert port_overlap(2, 18180, 18181) == (
        "--base-port 18180 and --tls-base-port 18181 overlap: with 2 node(s), node-1 would listen on 18181 and "
        "node-0 answer TLS on it; give the ranges 2 ports apart (e.g. --tls-base-port 18182)")
    assert port_overlap(3, 18183, 18181) is not None  # TLS below, reaching into the HTTP range
    assert port_overlap(3, 18180, 18180) is not None


@pytest.mark.parametrize("nodes, base, tls", [(2, 18180, 18182), (2, 18182, 18180), (1, 18180, 18181),
                                              (3, 18180, None)])
def test_ranges_that_do_not_meet_pass(nodes, base, tls):
    assert port_overlap(nodes, base, tls) is None
