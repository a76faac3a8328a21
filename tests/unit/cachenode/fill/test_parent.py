"""When a node with a parent tier asks it, and when it goes to the origin instead (cachenode/fill/parent.py)."""

from __future__ import annotations

import pytest

from cachenode.fill.parent import RECHECK_AFTER, ParentHealth, answer_fallback, asks_parent, looped, may_retry_on_origin
from nezha.wire import ParentFallback


@pytest.mark.parametrize("has_parent, scheme, from_child, expected", [
    (True, "http", False, True),
    # No parent: the origin, always.
    (False, "http", False, False),
    # A child's request is never passed up again: one hop between tiers, no loop.
    (True, "http", True, False),
    # https:// targets exist only on a node that terminates TLS itself; the parent's plain port cannot carry them.
    (True, "https", False, False),
])
def test_a_request_goes_to_the_parent_only_when_it_has_one_and_did_not_come_from_a_child(
        has_parent, scheme, from_child, expected):
    assert asks_parent(has_parent=has_parent, scheme=scheme, from_child=from_child) is expected


@pytest.mark.parametrize("status, cache, expected", [
    (200, "hit", None),
    (304, "revalidated", None),
    (404, "miss", None),  # an answer: the origin's 404, stored or not
    (206, None, None),
    # The parent failing: its own 503 (connection cap), 502/504 it made
    # because it could not reach the origin, anything 5xx from a non-Nezha hop.
    (503, None, ParentFallback.ERROR_STATUS),
    (502, None, ParentFallback.ERROR_STATUS),
    (504, "error", ParentFallback.ERROR_STATUS),
    (500, "miss", ParentFallback.ERROR_STATUS),
    # The origin's own 5xx, passed on untouched by the parent: the same answer here, not a second try.
    (503, "pass", None),
    (500, "bypass", None),
    (502, "denied", None),
])
def test_a_5xx_sends_the_request_to_the_origin_unless_the_parent_passed_on_the_origins_own(status, cache, expected):
    assert answer_fallback(status, cache) == expected


@pytest.mark.parametrize("has_body, connected, expected", [
    (False, False, True),
    (False, True, True),
    (True, False, True),  # the connection never opened: no byte of the body was read
    (True, True, False),  # a streamed body may be gone: it cannot be sent twice
])
def test_a_request_with_a_body_is_sent_to_the_origin_only_if_the_parent_never_read_it(has_body, connected, expected):
    assert may_retry_on_origin(has_body=has_body, connected=connected) is expected


def test_a_parent_that_failed_is_skipped_until_recheck_after_then_tried_again():
    health = ParentHealth()
    assert not health.skip(100.0)
    health.failed(100.0)
    assert health.skip(100.0)
    assert health.skip(100.0 + RECHECK_AFTER - 0.01)
    assert not health.skip(100.0 + RECHECK_AFTER)
    health.failed(200.0)
    health.answered()
    assert not health.skip(200.0)


@pytest.mark.parametrize("via, from_child, expected", [
    ([], False, False),
    (["1.1 client-proxy"], False, False),
    (["1.1 sidecar"], False, True),
    (["1.0 corp, 1.1 sidecar (Nezha)"], False, True),
    (["1.1 corp", "1.1  sidecar"], False, True),
    (["1.1 sidecar-2"], False, False),
    # A child's request is not judged: child and parent may share a default identity.
    (["1.1 sidecar"], True, False),
])
def test_a_request_that_already_passed_through_this_node_is_a_loop(via, from_child, expected):
    assert looped(via, "1.1 sidecar", from_child=from_child) is expected
