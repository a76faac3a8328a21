"""Structured logging: one JSON event per line on stdout.

Event names are fixed snake_case strings; variables travel as keys. Every
component calls `configure()` once at start-up, from `nezha.cli`.

structlog is imported where it is used, not with this module: every command
module imports `configure`, and `nezha` builds every command's parser, so a
top-level import put structlog (and, where it is installed, rich, which
structlog.dev loads) into processes that never log through it, such as the
first process of a node with several workers, which only checks the settings
and execs the supervisor (cachenode/workers/supervisor.py).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from nezha.credentials import redact_text

# Fields that differ between otherwise identical events: a request's
# duration, a fill's seconds, the time itself. Events equal but for these
# are one event repeated.
VOLATILE_FIELDS = frozenset({"timestamp", "ms", "seconds"})


_ABSENT = object()


class CollapseRepeats:
    """Drops an event identical to the one just printed within `window`
    seconds, and says how many it dropped in one `log_repeated` line when
    the run ends (a different event, or the same after the window).

    One client pipelining 33 MiB of identical HEAD requests wrote 688,708
    `request_completed` lines; a flood of identical warnings is the same
    problem. Only consecutive repeats collapse, so interleaved events all
    print and the output stays in order. Events with an exception are
    never dropped.
    """

    def __init__(self, render: Callable[[Any, str, dict], str], *, window: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._render = render
        self.window = window
        self._clock = clock
        self._lock = threading.RLock()  # a signal handler that logs may interrupt a holder
        self._last: dict | None = None  # the event printed last, to compare the next with
        self._printed_at = 0.0
        self._dropped = 0
        self._first_drop = self._last_drop = 0.0
        self._level = "info"
        self._event = ""
        self._logger: Any = None
        from structlog import DropEvent

        self._drop = DropEvent

    @staticmethod
    def _same(a: dict, b: dict | None) -> bool:
        """Equal but for VOLATILE_FIELDS, value by value and type by type (1
        and True are not one field). Compared in place, not through a sorted
        key of reprs: this runs for every access log line, and most differ
        from the last in their first fields."""
        if b is None or a.get("event") != b.get("event"):
            return False
        volatile = VOLATILE_FIELDS
        for k, v in a.items():
            if k in volatile:
                continue
            w = b.get(k, _ABSENT)
            if w is not v and (type(w) is not type(v) or w != v):
                return False
        return sum(k not in volatile for k in a) == sum(k not in volatile for k in b)

    def __call__(self, logger: Any, method: str, event_dict: dict) -> dict:
        now = self._clock()
        carries_error = "exception" in event_dict or "exc_info" in event_dict
        with self._lock:
            self._logger = logger
            if not carries_error and now - self._printed_at < self.window and self._same(event_dict, self._last):
                if not self._dropped:
                    self._first_drop = now
                self._dropped += 1
                self._last_drop = now
                raise self._drop
            summary = self._take_summary(event_dict.get("timestamp"))
            self._last, self._printed_at = event_dict, now
            self._level, self._event = event_dict.get("level", "info"), str(event_dict.get("event", ""))
        if summary is not None:
            logger.msg(self._render(logger, method, summary))
        return event_dict

    def _take_summary(self, timestamp: Any) -> dict | None:
        if not self._dropped:
            return None
        summary = {"event": "log_repeated", "repeated_event": self._event, "times": self._dropped,
                   "over_s": round(self._last_drop - self._first_drop, 3), "level": self._level}
        if timestamp is not None:
            summary["timestamp"] = timestamp
        self._dropped = 0
        return summary

    def flush(self) -> None:
        """Print the count of a run still pending (a component may call this at exit)."""
        with self._lock:
            summary = self._take_summary(None)
            logger = self._logger
            self._last = None
        if summary is not None and logger is not None:
            logger.msg(self._render(logger, "info", summary))


class Timestamp:
    """`timestamp` as structlog's ISO UTC stamper writes it
    (2026-11-26T17:03:55.744947Z), with the date and time of day formatted
    once a second rather than for every line."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._second = -1
        self._prefix = ""

    def __call__(self, logger: Any, method: str, event_dict: dict) -> dict:
        now = self._clock()
        second = int(now)
        micro = round((now - second) * 1e6)  # rounded, as datetime rounds a float's microseconds
        if micro >= 1_000_000:
            second, micro = second + 1, micro - 1_000_000
        if second != self._second:
            self._prefix = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.")
            self._second = second
        event_dict["timestamp"] = f"{self._prefix}{micro:06d}Z"
        return event_dict


_collapse: CollapseRepeats | None = None


# The origins' own credential parameters (`credential_params`), set by configure().
_credential_params: frozenset[str] = frozenset()


_SCALARS = frozenset({int, float, bool, type(None)})


def redact_credentials(logger: Any, method: str, event_dict: dict) -> dict:
    """Every string in an event with the credential parameters of the URLs
    in it redacted (nezha/credentials.py): a presigned URL in a request
    line, a cache key or an error message is a bearer credential, and log
    lines are read by more people than the bucket's owner."""
    extra = _credential_params
    for name, value in event_dict.items():
        kind = type(value)
        if kind is str or (kind not in _SCALARS and isinstance(value, str)):  # every access log line: kept cheap
            if "?" in value:
                event_dict[name] = redact_text(value, extra)
        elif kind in _SCALARS:
            continue
        elif isinstance(value, (list, tuple)):
            event_dict[name] = [redact_text(v, extra) if isinstance(v, str) else v for v in value]
    return event_dict


def flush_repeats() -> None:
    """Write the pending `log_repeated` line, if any."""
    if _collapse is not None:
        _collapse.flush()


def reset() -> None:
    """Logging as a fresh process has it, before any `configure()`: structlog's
    defaults (each event printed to the sys.stdout of the moment) and no
    repeats pending. For a process that runs commands in-process one after
    another, as the test suite does: `configure()` binds the stream it was
    given, or the sys.stdout of that moment (a test's captured output), and
    every later event would otherwise go there."""
    import structlog

    global _collapse, _credential_params
    _collapse, _credential_params = None, frozenset()
    structlog.reset_defaults()


def configure(*, level: str = "info", json: bool = True, stream=None, cache_loggers: bool = False,
              repeat_window: float = 1.0, clock: Callable[[], float] = time.monotonic,
              credential_params: Iterable[str] = ()) -> None:
    """`cache_loggers` binds each module's logger once, on first use: worth it
    in a server's hot path (rebinding showed in profiles), wrong for commands
    run in-process by tests, whose output streams come and go.
    `credential_params`: query parameters redacted in every event beside the
    signed-URL families (the origins' own `credential_params`)."""
    import structlog

    global _collapse, _credential_params
    _credential_params = frozenset(n.lower() for n in credential_params)
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    _collapse = CollapseRepeats(renderer, window=repeat_window, clock=clock)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            Timestamp(),
            structlog.processors.format_exc_info,
            redact_credentials,
            _collapse,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # One write per line: print() writes a line and its newline apart, and on an
        # unbuffered stream shared by a node's processes two lines could join.
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=cache_loggers,
    )
    # Libraries (aiohttp, asyncio) log through the standard library; keep them
    # on stderr at warning level so stdout stays one JSON event per line.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
