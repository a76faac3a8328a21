"""A real redis-server on 127.0.0.1, as the tests and bench/controller.py run it.

The index is tested against the real server (DESIGN.md, "Real components in
tests"), and several tests need more than one way of starting it: with a
password, TLS only, as a Sentinel watching another one, stopped and started
again on the same port to prove that nodes outlive Redis. One class holds
all of them, so each test says which Redis it wants, not how to launch it.
No persistence: every server starts empty in its own folder.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from testkit.ports import free_port
from testkit.waits import wait_port


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS-only server: its certificate and key, and the CA clients trust."""

    cert: Path
    key: Path
    ca: Path


class RedisServer:
    """A real redis-server on 127.0.0.1, which a test may stop and start again
    on the same port (to prove that nodes survive Redis going away).

    With `tls`, it listens for TLS only, on `port`, and does not ask clients
    for certificates.
    """

    def __init__(self, exe: str, workdir: Path, password: str | None = None, *, tls: TLSFiles | None = None,
                 replica_of: "RedisServer | None" = None) -> None:
        self.exe = exe
        self.workdir = workdir
        self.port = free_port()
        self.password = password
        self.tls = tls
        self.replica_of = replica_of  # a replica of that server, with the same password (Sentinel may promote it)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            listen = ["--port", "0", "--tls-port", str(self.port)]
        # A replica's first sync starts at once, not after Redis's default 5 s wait for others.
        args = [self.exe, *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--repl-diskless-sync-delay", "0"]
        if self.tls is not None:
            args += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key),
                     "--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
            if self.replica_of.password:
                args += ["--masterauth", self.replica_of.password]
        return args

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port("127.0.0.1", self.port, timeout=10, proc=self.proc, what=Path(self.exe).name)

    def stop(self, *, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


class RedisSentinel(RedisServer):
    """redis-server in Sentinel mode, monitoring `master` as `name`.

    Sentinel rewrites its config file, so each one writes its own, in
    `workdir` (give each Sentinel a folder of its own). `quorum` Sentinels
    must agree that the master is down, after `down_after_ms` without an
    answer, before one of them promotes a replica.
    """

    def __init__(self, exe: str, workdir: Path, *, master: RedisServer, name: str = "mymaster", quorum: int = 1,
                 down_after_ms: int = 30000, failover_timeout_ms: int = 180000) -> None:
        super().__init__(exe, workdir)
        self.master = master
        self.name = name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def args(self) -> list[str]:
        conf = self.workdir / "sentinel.conf"
        auth = f"sentinel auth-pass {self.name} {self.master.password}\n" if self.master.password else ""
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                        f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} {self.quorum}\n{auth}"
                        f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}\n"
                        f"sentinel failover-timeout {self.name} {self.failover_timeout_ms}\n")
        return [self.exe, str(conf), "--sentinel"]
