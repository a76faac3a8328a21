"""How each wait on a fill's pace ended (cachenode/fill/pace.py `Pace.wait`): a peer moved or left, or its
timer ran out, and that timer's seconds.

"A peer that stands still is waited for STALL at most" is a claim about which timer ends the wait, and how
many waits there are, not about the seconds a loaded machine takes to run them: tests record this instead
of timing the wait (pytest-timeout stops one that hangs).
"""

from __future__ import annotations

import asyncio

import pytest

from cachenode.fill import pace as pace_module
from cachenode.fill.pace import Pace


class _Timers:
    """pace.py's `asyncio`, whose `timeout` notes the seconds it is given."""

    def __init__(self, given: list[float | None]) -> None:
        self._given = given

    def timeout(self, delay: float | None) -> asyncio.Timeout:
        self._given.append(delay)
        return asyncio.timeout(delay)

    def __getattr__(self, name: str):
        return getattr(asyncio, name)


def _recording(monkeypatch: pytest.MonkeyPatch, ended: list[tuple[str, float | None]], seen: list[Pace]):
    """`Pace.wait`, recording into `ended` how each wait ended and its timer, and into `seen` each pace waited on."""
    wait = Pace.wait
    given: list[float | None] = []
    monkeypatch.setattr(pace_module, "asyncio", _Timers(given))

    async def recorded(pace: Pace) -> None:
        moved = pace._moved  # the event this wait is woken by: set when a peer moves or leaves
        if pace not in seen:
            seen.append(pace)
        mark = len(given)
        await wait(pace)
        [timer] = given[mark:mark + 1]
        ended.append(("moved" if moved.is_set() else "timer", timer))

    return recorded


def wait_ends(pace: Pace, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """From now on, each wait on `pace` appends how it ended, "moved" (woken by a peer) or "timer", with the
    seconds of the timer it ran under."""
    ended: list[tuple[str, float | None]] = []
    recorded = _recording(monkeypatch, ended, [])
    monkeypatch.setattr(pace, "wait", lambda: recorded(pace))
    return ended


def every_wait_ends(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, float | None]], list[Pace]]:
    """The same for every pace (those a node makes for its fills), and the paces waited on, kept alive."""
    ended: list[tuple[str, float | None]] = []
    seen: list[Pace] = []
    monkeypatch.setattr(Pace, "wait", _recording(monkeypatch, ended, seen))
    return ended, seen
