"""How every long-running Nezha command ends: SIGINT or SIGTERM, or a test's event."""

from __future__ import annotations

import asyncio
import contextlib
import signal


def stop_on_signals(stop: asyncio.Event | None = None, *, hangup: bool = False) -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (Ctrl-C, `kubectl delete pod`), and with
    `hangup` by SIGHUP too (its terminal closed: `nezha up` stops what it started).

    Pass the event a test holds to stop the command without a signal. Where
    signal handlers cannot be installed (not the main thread), only the event
    stops it.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hangup else ())):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    return stop
