"""Structured logging: one JSON event per line on stdout.

Event names are fixed snake_case strings; variables travel as keys. Every
component calls `configure()` once at start-up, from `nezha.cli`.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(*, level: str = "info", json: bool = True, stream=None) -> None:
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
        # Cached: rebinding the lazy logger proxy on every call showed in profiles.
        cache_logger_on_first_use=True,
    )
    # Libraries (aiohttp, asyncio) log through the standard library; keep them
    # on stderr at warning level so stdout stays one JSON event per line.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
