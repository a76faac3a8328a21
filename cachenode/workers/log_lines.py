"""The supervisor's log: the lines nezha.logs writes, without structlog.

The supervisor of a node's workers only starts, watches and restarts them,
and imports only what that needs (cachenode/workers/supervisor.py):
structlog alone, with the asyncio and rich it imports, would be most of
its memory. Its few events are written here in the form every other Nezha
process writes: one JSON object a line on stdout, its fields, then
`event`, `level` and `timestamp` (ISO UTC, microseconds, Z).
"""

from __future__ import annotations

import json
import sys
import time

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class LogLines:
    def __init__(self, level: str = "info", stream=None) -> None:
        self.level = level
        self._stream = stream

    @property
    def level(self) -> str:
        return self._level

    @level.setter
    def level(self, name: str) -> None:
        self._level = name if name in _LEVELS else "info"
        self._threshold = _LEVELS[self._level]

    def _write(self, level: str, event: str, fields: dict) -> None:
        if _LEVELS[level] < self._threshold:
            return
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
        line = json.dumps({**fields, "event": event, "level": level, "timestamp": stamp}, default=str)
        stream = self._stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()

    def info(self, event: str, **fields: object) -> None:
        self._write("info", event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._write("warning", event, fields)

    def error(self, event: str, **fields: object) -> None:
        self._write("error", event, fields)
