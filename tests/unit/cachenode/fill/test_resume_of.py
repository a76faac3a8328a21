"""What counts as a resume a fill may start from (cachenode/fill/lead.py `resume_of`, `answered_span`), and
that a fill led by one is read in ranges around its answer whatever the object's size (`plan_fill`)."""

from __future__ import annotations

import pytest

from cachenode.fill.lead import Body, How, Resume, answered_span, plan_fill, resume_of


@pytest.mark.parametrize("range_field, if_range, want", [
    ("bytes=16842752-50331647", '"v1"', Resume(16842752, 50331647, '"v1"')),
    ("bytes=100-", "Wed, 01 Jan 2025 00:00:00 GMT", Resume(100, None, "Wed, 01 Jan 2025 00:00:00 GMT")),
    ("bytes=100-", None, None),  # no If-Range: not pinned to a version
    ("bytes=100-", 'W/"v1"', None),  # a weak validator may not pin a range
    ("bytes=0-", '"v1"', None),  # from the start: the whole object, an ordinary fill
    ("bytes=0-99,200-", '"v1"', None),  # several ranges
    ("bytes=-500", '"v1"', None),  # a suffix
    ("bytes=9-3", '"v1"', None),
    (None, '"v1"', None),
])
def test_only_one_range_past_the_start_under_a_strong_validator_is_a_resume(range_field, if_range, want):
    assert resume_of(range_field, if_range) == want


def test_the_range_asked_of_the_origin_is_the_resumes_own():
    assert Resume(100, None, '"v"').range == "bytes=100-"
    assert Resume(100, 199, '"v"').range == "bytes=100-199"


@pytest.mark.parametrize("resume, status, content_range, want", [
    (Resume(100, None, '"v"'), 206, "bytes 100-999/1000", (100, 1000, 1000)),
    (Resume(100, 1999, '"v"'), 206, "bytes 100-999/1000", (100, 1000, 1000)),  # asked past the end
    (Resume(100, 499, '"v"'), 206, "bytes 100-499/1000", (100, 500, 1000)),
    (Resume(100, None, '"v"'), 200, None, None),  # the validator changed: the whole new version
    (Resume(100, None, '"v"'), 206, "bytes 0-999/1000", None),  # not the range asked
    (Resume(100, None, '"v"'), 206, "bytes 100-998/1000", None),  # short of the end asked
    (Resume(100, None, '"v"'), 206, "bytes 100-999/*", None),  # no length: nothing to cut the rest by
])
def test_only_a_206_for_exactly_the_range_asked_starts_a_fill(resume, status, content_range, want):
    assert answered_span(resume, status, content_range) == want


@pytest.mark.parametrize("fill_on_range", [True, False])
def test_a_fill_led_by_a_resume_is_read_in_ranges_whatever_its_size(fill_on_range):
    body = Body(from_peer=False, delimited_by_close=False, rangeable=True, client_ranged=True, resumed=True)
    plan = plan_fill(body, splice_fills=True, fill_on_range=fill_on_range)
    assert plan.how is How.PARALLEL and plan.on_demand is (not fill_on_range)
