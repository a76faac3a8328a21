"""Structured logging: one JSON event per line on stdout.

Event names are fixed snake_case strings; variables travel as keys. Every
component calls `configure()` once at start-up, from `nezha.cli`.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(*, level: str = "info", json: bool = True, stream=None, cache_loggers: bool = False) -> None:
    """`cache_loggers` binds each module's logger once, on first use: worth it
    in a server's hot path (rebinding showed in profiles), wrong for commands
    run in-process by tests, whose output streams come and go."""
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=cache_loggers,
    )
    # Libraries (aiohttp, asyncio) log through the standard library; keep them
    # on stderr at warning level so stdout stays one JSON event per line.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
