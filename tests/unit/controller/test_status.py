"""When the status annotation is rewritten: on a change of what it says, not on every pass."""

from __future__ import annotations

import pytest

from controller.status import build, render, should_write

BASE = build(epoch=3, members=["b", "a"], replicas_per_key=2, hit_ratio=0.5, leader="c-a")


@pytest.mark.parametrize("current,new,now,last,write", [
    (None, BASE, 0, None, True),
    (render(BASE), BASE, 0, 0, False),
    (render(BASE), {**BASE, "epoch": 4}, 1, 0, True),
    (render(BASE), {**BASE, "leader": "c-b"}, 1, 0, True),
    (render(BASE), {**BASE, "hitRatio": 0.505}, 100, 0, False),  # moved less than a step
    (render(BASE), {**BASE, "hitRatio": 0.6}, 10, 0, False),  # moved, but written 10 s ago
    (render(BASE), {**BASE, "hitRatio": 0.6}, 40, 0, True),
    ("{not json", BASE, 0, 0, True),  # edited by hand into garbage: put it right
])
def test_status_is_written_when_it_would_say_something_new(current, new, now, last, write):
    assert should_write(current, new, now=now, last_write_at=last) is write


def test_members_are_sorted_and_the_ratio_rounded():
    assert BASE["members"] == ["a", "b"] and build(epoch=1, members=[], replicas_per_key=None, hit_ratio=2 / 3,
                                                   leader="x")["hitRatio"] == 0.667
