"""`nezha cache --workers N`: the process that starts a node's workers, starts
again any that dies, and stops them all on SIGTERM (docs/cache-node.md,
"Workers").

It serves nothing itself and holds no state beyond the children it
started, so it has nothing that could fail with them. Worker 0 is the
primary (the node as a single process is, plus the links); workers 1..N-1
are followers. Each is this same command, started again with the same
flags, environment and config file, and told its role in the environment.

Links are socketpairs made here: one end of a control link goes to the
primary; for each follower, one end of its link goes to the follower and
the other to the primary, over the control link. So a follower started
again joins the running primary; a primary started again makes every
follower leave (its link is gone), and each is started again and joins the
new one.

Children get SIGKILL if this process dies (nezha.localproc.die_with_parent):
a node killed with -9 leaves no worker behind on its port.

The ports are bound here first (`reserve`, with SO_REUSEPORT, never
listening, so they take no connection) and held for as long as the workers
run: a taken port is reported as a single process reports it, and a port of
0 ("any free one"), which would give each worker a port of its own, is
chosen once and told to each worker in its environment.

Lean. `nezha cache` checks its settings, takes the data folder's lock and
binds the ports in the process the user started; then `supervise` execs a
fresh interpreter into `main` below, with the same pid and with the lock
and the ports' descriptors kept open across the exec. That interpreter
imports this module and what it needs (the standard library, the typed
messages, the restart plan), never pydantic, aiohttp, structlog,
prometheus or the node: the process that only watches is about 14 MiB, not
a second node's 70 (tests/integration/cachenode/test_lean_supervisor.py
checks what it imports). Its log lines are cachenode/workers/log_lines.py.
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from cachenode.workers.log_lines import LogLines
from cachenode.workers.messages import Follower, Ready, decode, encode
from cachenode.workers.plan import restart_delay
from nezha.errors import RunError
from nezha.localproc import die_with_parent

log = LogLines()

ROLE_ENV = "NEZHA_WORKER_ROLE"  # "primary" or "follower"; unset: not a worker
LINK_ENV = "NEZHA_WORKER_LINK"  # the inherited descriptor of the worker's link
INDEX_ENV = "NEZHA_WORKER_INDEX"
# The listen addresses the workers share, where the settings said port 0.
ADDRESS_ENV = {"listen": "NEZHA_WORKER_LISTEN", "tls_listen": "NEZHA_WORKER_TLS_LISTEN"}
# What `supervise` tells the supervisor it execs into (JSON); no worker sees it.
PLAN_ENV = "NEZHA_WORKER_PLAN"
_QUICK = 5.0  # an exit this soon after a start counts toward the restart delay


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ever_ready: bool = False  # it served once: a later exit is a crash to restart, not a setting to report
    quick_exits: int = 0
    start_at: float = 0.0  # when to start it again
    control: socket.socket | None = None  # the primary's control link, our end


def reserve(addresses: dict[str, tuple[str, int] | None]) -> tuple[dict[str, str], list[socket.socket]]:
    """Bind each address here first, with SO_REUSEPORT, so that the workers
    can share it and nothing else can take it while they run (or between a
    worker's death and its restart). A port already taken fails here, with
    the error a single process gives, rather than as a worker's exit. Port
    0 becomes the free port bound: the environment that tells the workers,
    and the sockets that hold the ports until this process exits."""
    env: dict[str, str] = {}
    held: list[socket.socket] = []
    for setting, address in addresses.items():
        if address is None:
            continue
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            s.close()
            for h in held:
                h.close()
            shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
            why = (e.strerror or str(e)).lower()  # as asyncio words it for a single process
            raise RunError(f"cannot listen on {shown} (--{setting.replace('_', '-')}): {why}") from e
        held.append(s)
        if port == 0:
            port = s.getsockname()[1]
            env[ADDRESS_ENV[setting]] = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    return env, held


def shared_addresses(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """In a worker: the settings `reserve` chose for it (setting -> HOST:PORT)."""
    return {setting: environ[name] for setting, name in ADDRESS_ENV.items() if name in environ}


class Supervisor:
    def __init__(self, argv: list[str], workers: int, env: dict[str, str] | None = None,
                 keep_fds: tuple[int, ...] = ()) -> None:
        self.argv = argv
        self.keep_fds = keep_fds  # descriptors every worker inherits: the data folder's lock
        self.env = env or {}
        self.workers = [_Worker(i) for i in range(workers)]
        self.stopping = False
        self.exit_code = 0

    @property
    def primary(self) -> _Worker:
        return self.workers[0]

    def _spawn(self, worker: _Worker, link: socket.socket) -> None:
        env = {**{k: v for k, v in os.environ.items() if k != PLAN_ENV}, **self.env, ROLE_ENV: "primary" if worker.index == 0 else "follower",
               LINK_ENV: str(link.fileno()), INDEX_ENV: str(worker.index)}
        # A node killed with -9 leaves no worker serving its port alone.
        worker.proc = subprocess.Popen([sys.executable, "-m", "nezha", *self.argv], env=env,
                                       pass_fds=(link.fileno(), *self.keep_fds), preexec_fn=die_with_parent(signal.SIGKILL))
        worker.started = time.monotonic()
        link.close()
        log.info("worker_started", worker=worker.index, pid=worker.proc.pid,
                 role="primary" if worker.index == 0 else "follower")

    def _start_primary(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.primary.control = ours
        self._spawn(self.primary, theirs)

    def _start_follower(self, worker: _Worker) -> None:
        control = self.primary.control
        if control is None or self.primary.proc is None:
            worker.start_at = time.monotonic() + 0.1  # once there is a primary to join
            return
        for_primary, for_follower = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            control.sendmsg([encode(Follower(worker=worker.index))],
                           [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [for_primary.fileno()]))])
        except OSError:
            for_follower.close()
            worker.start_at = time.monotonic() + 0.1
            return
        finally:
            for_primary.close()
        self._spawn(worker, for_follower)

    def _read_control(self) -> None:
        control = self.primary.control
        if control is None:
            return
        while True:
            ready, _, _ = select.select([control], [], [], 0)
            if not ready:
                return
            try:
                data = control.recv(65536)
            except OSError:
                data = b""
            if not data:
                return
            try:
                message, _ = decode(data)
            except ValueError:
                continue
            if isinstance(message, Ready) and message.worker is not None:
                index = message.worker
                if 0 <= index < len(self.workers):
                    w = self.workers[index]
                    w.ever_ready = True
                    w.quick_exits = 0

    def _reaped(self, worker: _Worker, code: int) -> None:
        worker.proc = None
        if worker.index == 0 and worker.control is not None:
            worker.control.close()
            worker.control = None
        if self.stopping:
            if worker.index == 0:
                # Dead of the SIGTERM this stop sent it is stopped as asked: a primary that had
                # already drained on the group's Ctrl-C and closed its loop takes it by default.
                self.exit_code = 0 if code == -signal.SIGTERM else code
            return
        log.error("worker_exited", worker=worker.index, code=code, restart=worker.ever_ready)
        if not worker.ever_ready:
            # It never served: a setting or the port is wrong, and would be on every start.
            self.exit_code = code or 1
            self.stop()
            return
        worker.quick_exits = worker.quick_exits + 1 if time.monotonic() - worker.started < _QUICK else 1
        worker.start_at = time.monotonic() + restart_delay(worker.quick_exits)

    def stop(self, *_: object) -> None:
        if self.stopping:
            return
        self.stopping = True
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)

    def _signalled(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            log.info("workers_stopping", signal=signal.Signals(signum).name)
        self.stop()

    def run(self) -> int:
        # SIGHUP too (a closed terminal, a process group's hang-up): every
        # worker drains as on SIGTERM; under nohup it stays ignored.
        signal.signal(signal.SIGTERM, self._signalled)
        signal.signal(signal.SIGINT, self._signalled)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            signal.signal(signal.SIGHUP, self._signalled)
        self._start_primary()
        for w in self.workers[1:]:
            self._start_follower(w)
        while True:
            self._read_control()
            for w in self.workers:
                if w.proc is not None:
                    code = w.proc.poll()
                    if code is not None:
                        self._reaped(w, code)
            if self.stopping:
                if all(w.proc is None for w in self.workers):
                    return self.exit_code
            else:
                now = time.monotonic()
                if self.primary.proc is None and now >= self.primary.start_at:
                    self._start_primary()
                for w in self.workers[1:]:
                    if w.proc is None and now >= w.start_at:
                        self._start_follower(w)
            control = self.primary.control
            try:
                select.select([control] if control is not None else [], [], [], 0.05)
            except InterruptedError:
                pass


def supervise(argv: list[str], workers: int, addresses: dict[str, tuple[str, int] | None], *,
              keep_fds: tuple[int, ...] = (), log_level: str = "info") -> int:
    """Become the supervisor of `workers` workers, each `nezha <argv>`: bind the
    ports (`reserve`; a taken one raises RunError here), then exec into `main`
    with them and `keep_fds` (the data folder's lock) still open. Returns
    only if the exec fails (RunError)."""
    log.level = log_level
    env, held = reserve(addresses)
    if env:
        log.info("ports_chosen", **{setting: env[name] for setting, name in ADDRESS_ENV.items() if name in env})
    for fd in (*keep_fds, *(s.fileno() for s in held)):
        os.set_inheritable(fd, True)
    plan = {"workers": workers, "env": env, "keep_fds": list(keep_fds), "held": [s.fileno() for s in held],
            "log_level": log_level}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-m", "cachenode.workers.supervisor", *argv],
                  {**os.environ, PLAN_ENV: json.dumps(plan)})
    except OSError as e:
        for s in held:
            s.close()
        raise RunError(f"cannot start the workers' supervisor ({sys.executable}): {e.strerror or e}") from e
    raise AssertionError("unreachable: execve returned")


def main() -> int:
    """The supervisor, exec'd by `supervise`: argv is the node's, the plan in PLAN_ENV.
    The ports' descriptors stay open, unused, until it exits."""
    plan = json.loads(os.environ.pop(PLAN_ENV))
    log.level = plan["log_level"]
    try:
        return Supervisor(sys.argv[1:], int(plan["workers"]), plan["env"], tuple(plan["keep_fds"])).run()
    except KeyboardInterrupt:  # before its handlers were installed
        return 130


if __name__ == "__main__":
    sys.exit(main())
