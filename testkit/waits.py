"""Waiting for a process that was just started to answer on its port or URL.

Every test and benchmark starts servers (redis-server, `nezha cache`,
`nezha webhook`, nginx) and must not use them before they listen, nor wait
for ever when one never will. These waits poll with a deadline and, when
they give up, raise `NotAnswering` saying what did not answer, where, and,
when they were given the process and its log, whether it exited and its
last words, instead of a bare timeout.

`NotAnswering` is an AssertionError, so in a test it reads as the failure
it is; bench/harness.py turns it into a BenchError.

A wait for a process to start or to report a state ends on that event:
the answer, or the process's exit. Its deadline (`START_GUARD`) only stops
a hung test. It is not a claim about how fast a node starts: on a loaded
machine a node takes many seconds (at load 10 on two cores a `nezha cache`
took 6 to 11 s to answer /readyz), and a deadline near that decided passes
by the machine's load, not by what the test checks.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_
import subprocess
import time
from pathlib import Path
from typing import Union

import aiohttp

Process = Union[subprocess.Popen, asyncio.subprocess.Process]


# How long a started process may take to answer, or to report what a test
# waits for, before the wait calls it hung. A guard against a hang, never
# what decides a pass (the module's docstring).
START_GUARD = 60.0


class NotAnswering(AssertionError):
    """A process did not answer on its port or URL before the deadline, or exited first."""


def answers(host: str, port: int, *, timeout: float = 0.5) -> bool:
    """True when a TCP connection to host:port is accepted now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _exit_code(proc: Process | None) -> int | None:
    if proc is None:
        return None
    return proc.poll() if isinstance(proc, subprocess.Popen) else proc.returncode


def _tail(log: Path | None, limit: int = 2000) -> str:
    if log is None:
        return ""
    try:
        text = log.read_text(errors="replace")[-limit:]
    except OSError as e:
        return f"; its log {log} cannot be read: {e.strerror}"
    return f"; its log {log} ends:\n{text}" if text else f"; its log {log} is empty"


def _exited(what: str, where: str, proc: Process | None, log: Path | None) -> NotAnswering | None:
    code = _exit_code(proc)
    if code is None:
        return None
    return NotAnswering(f"{what} exited with code {code} before it answered on {where}{_tail(log)}")


def _late(what: str, where: str, timeout: float, log: Path | None, last: str, *,
          awaited: str = "answer on") -> NotAnswering:
    seen = f" (last: {last})" if last else ""
    return NotAnswering(f"{what} did not {awaited} {where} within {timeout:g} s{seen}{_tail(log)}")


def wait_port(host: str, port: int, *, timeout: float = 10.0, proc: Process | None = None,
              log: Path | None = None, what: str = "server", interval: float = 0.02) -> None:
    """Block until host:port accepts a TCP connection (for code with no event loop)."""
    where = f"{host}:{port}"
    deadline = time.monotonic() + timeout
    while not answers(host, port, timeout=0.2):
        if (died := _exited(what, where, proc, log)) is not None:
            raise died
        if time.monotonic() >= deadline:
            raise _late(what, where, timeout, log, "")
        time.sleep(interval)


async def until_port(host: str, port: int, *, timeout: float = 10.0, proc: Process | None = None,
                     log: Path | None = None, what: str = "server", interval: float = 0.05) -> None:
    """Await until host:port accepts a TCP connection; the event loop keeps running meanwhile."""
    where = f"{host}:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass
        else:
            writer.close()
            return
        if (died := _exited(what, where, proc, log)) is not None:
            raise died
        if time.monotonic() >= deadline:
            raise _late(what, where, timeout, log, "")
        await asyncio.sleep(interval)


async def until_http(url: str, *, timeout: float = 20.0, proc: Process | None = None, log: Path | None = None,
                     what: str = "server", status: int | None = 200, ssl: ssl_.SSLContext | None = None,
                     session: aiohttp.ClientSession | None = None, interval: float = 0.05) -> tuple[int, bytes]:
    """Await until a GET of `url` is answered (with `status`, unless None: any
    answer); returns that answer's status and body.

    Connection errors and other statuses are retried until the deadline; an
    exited `proc` ends the wait at once. `ssl` or `session` for HTTPS.
    """
    owned = session is None
    if session is None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl) if ssl is not None else None)
    deadline = time.monotonic() + timeout
    last = ""
    try:
        while True:
            try:
                left = max(1.0, deadline - time.monotonic())
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=left)) as r:
                    body = await r.read()
                    if status is None or r.status == status:
                        return r.status, body
                    last = f"status {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if (died := _exited(what, url, proc, log)) is not None:
                raise died
            if time.monotonic() >= deadline:
                raise _late(what, url, timeout, log, last)
            await asyncio.sleep(interval)
    finally:
        if owned:
            await session.close()


async def until_reported(url: str, check, *, proc: Process | None = None, log: Path | None = None,
                         what: str = "server", timeout: float = START_GUARD,
                         session: aiohttp.ClientSession | None = None, interval: float = 0.02) -> dict:
    """Await until the JSON status at `url` (a node's /readyz) satisfies
    `check(status)`; returns that status.

    For waits on what a process reports (a ring adopted, fills finished)
    rather than on a clock: it asks until the process says so, ends at once
    when `proc` exits, and names the last status seen if the guard runs out.
    Answers of any HTTP status count (a node not yet ready answers 503 with
    its status); connection errors are retried, the process still starting.
    """
    owned = session is None
    if session is None:
        session = aiohttp.ClientSession()
    deadline = time.monotonic() + timeout
    last = ""
    try:
        while True:
            try:
                left = max(1.0, deadline - time.monotonic())
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=left)) as r:
                    status = await r.json(content_type=None)
                if check(status):
                    return status
                last = f"reported {status}"
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if (died := _exited(what, url, proc, log)) is not None:
                raise died
            if time.monotonic() >= deadline:
                raise _late(what, url, timeout, log, last, awaited="report what the test waits for at")
            await asyncio.sleep(interval)
    finally:
        if owned:
            await session.close()


async def wait_for(predicate, timeout: float = 2.0) -> float:
    """Seconds until `predicate()` (sync or async) is true; fails after `timeout`.

    Polled every 10 ms: no fixed sleep that a loaded machine could outlast."""
    start = time.monotonic()
    await wait_for_value(lambda: _true_or_none(predicate()), timeout)
    return time.monotonic() - start


async def _true_or_none(result):
    if asyncio.iscoroutine(result):
        result = await result
    return True if result else None


async def wait_for_value(produce, timeout: float = 2.0):
    """The first value of `produce()` (sync or async) that is not None; fails after `timeout`.

    For waits whose answer the test goes on with (which pod became the
    master), where a falsy answer such as 0 is still an answer."""
    start = time.monotonic()
    while True:
        result = produce()
        if asyncio.iscoroutine(result):
            result = await result
        if result is not None:
            return result
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout} s")
        await asyncio.sleep(0.01)
