#!/usr/bin/env python3
"""The least a cold small fill can cost in Python here: a reference, not a cache.

`small_fill` (bench/small_files.py) holds the node's cold fills of 16 KiB
objects at `--workers 1` against nginx `proxy_cache` at one worker.
Whether 1.0 is within reach of any Python cache (CPython, asyncio, one
process) is a question about the language on this path, not about the
node: this measures the least such a cache does, beside nginx and the node.

The bare server (`--serve`), at the level of asyncio's Protocols (no HTTP
framework): reads a GET's head from a kept-alive client connection, looks
its path up in a dict (a hit is read from its file), and on a miss asks the
origin over a pool of kept-alive HTTP/1.1 connections, reads a 200 with a
Content-Length, writes the object as ONE new file (O_CREAT|O_EXCL, one
writev of a small header and the body, close; no fsync: the node leaves
durability to a group sync), records it in the dict and answers with a
status line, a few headers and the body in one `transport.write`. The
header holds the body's CRC32C (google-crc32c, about a microsecond), as
the node's sealed small files do. A request for a path being fetched
waits for that fetch. No Host in the key, no freshness, validators,
metrics, logs or eviction. Another answer than a 200 is passed on, not
stored; one without a Content-Length gets a 502. Prints "listening".

    python bench/bare_small_fill.py --serve --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT --dir DIR [--loop uvloop]

With `--rules [--host NAME]` (`Ruled`), the same server with the node's own
rules where the bare one cuts corners: the node's key and store, its
judgement of the origin's answer, its sealed small file and its miss head.
What a cold fill costs with the node's rules and without its per-fill
layers (the lead chain, flights, counts, metrics, logs; the node's
connection handling and origin client): its CPU less the bare server's is
what the rules cost, the node's less its own what the layers cost.

The benchmark (no --serve): an origin (Debian's nginx serving N files of
16 KiB) and in front of it, in turn, the order reversed every other round:
nginx `proxy_cache` at one worker (small_files.py's settings), the bare
server on asyncio and on uvloop (when the interpreter has it), the bare
server with the node's rules (`bare_rules`, on asyncio, as the node) and
`nezha cache --workers 1`, each fresh for each run (so only one run's objects are
stored at a time). Each fills and rereads 64 objects, checked byte for
byte against the origin's files, then, after `os.sync()` and a second's
pause, takes small_files.py's wrk command (64 connections, every path
asked once: every request a cold fill); the run's first 64 objects are
checked after it. Per run: fills/s and CPU per fill (the server's
processes' user + system, /proc/PID/stat), and its user part: nginx and the
bare server spend most of theirs in the kernel (the socket and file calls
every cache makes), the node in its own Python, so the user part is what a
change to the node's code moves. Last line: `ratios:
bare_small_fill=<bare/nginx> bare_uvloop_small_fill=...
bare_rules_small_fill=... node_small_fill=... node_over_bare=<node/bare>
node_over_bare_rules=... nginx_cpu_us=... bare_cpu_us=... (each server's)
nginx_user_us=... bare_user_us=... (each server's)`

    python bench/bare_small_fill.py [--rounds 3] [--seconds 5] [--objects 150000] [--python PATH] [--servers nginx,bare_rules,node]

--python: the interpreter of the bare server and of the node. Work folder on /dev/shm unless --work
says otherwise (the box's file creation kept out, as in
bench/small_fills_ab.py). Needs wrk, nginx and `pip install -e '.[test]'`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_ORIGIN_CONNECTIONS = 128
MAX_HEAD = 16 * 1024
HEADER = struct.Struct("<4sQIH")  # magic, body length, CRC32C of the body, key length; then the key
MAGIC = b"BSF1"
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\nX-Cache: %s\r\n\r\n"
REASONS = {400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 502: b"Bad Gateway"}
FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
KINDS = ("nginx", "bare", "bare_uvloop", "bare_rules", "node")  # the servers the benchmark compares
# nginx's settings as bench/small_files.py has them (bench/small_side_by_side.py's SIZES)
CONF = dict(by="bench/bare_small_fill.py", worker_connections=4096, nofile=65536)


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def plain(status: int, body: bytes, *, close: bool = False) -> bytes:
    return (b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n%s\r\n%s"
            % (status, REASONS.get(status, b"Answer"), len(body), b"Connection: close\r\n" if close else b"", body))


class Client(asyncio.Protocol):
    """One client connection: one request at a time (no pipelining)."""

    def __init__(self, server: "Bare") -> None:
        self.server, self.buf, self.busy = server, b"", False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self.next()

    def next(self) -> None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self.answer(plain(400, b"head too large", close=True), close=True)
            return
        head, self.buf = buf[:end], buf[end + 4:]
        one = head.find(b" ")
        two = head.find(b" ", one + 1)
        if one < 0 or two < 0:
            return self.answer(plain(400, b"no request line", close=True), close=True)
        if head[:one] != b"GET":
            return self.answer(plain(405, b"GET only", close=True), close=True)
        key = head[one + 1:two]
        found = self.server.find(key, head)
        self.busy = True
        if found is None:
            self.server.miss(self, key)
        else:
            self.answer(self.server.hit(found))

    def answer(self, data: bytes, *, close: bool = False) -> None:
        self.busy = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        if close:
            transport.close()
        elif self.buf:
            self.next()

    def connection_lost(self, exc) -> None:
        self.transport = None


class Origin(asyncio.Protocol):
    """One kept-alive connection to the origin: one request at a time."""

    def __init__(self, server: "Bare") -> None:
        self.server, self.transport, self.buf = server, None, b""
        self.key: bytes | None = None  # the path asked, until its answer is whole
        self.want = -1  # the body's length once the head is read
        self.head = b""  # the head of the answer being read (its blank line left off), once read

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.ready(self)

    def ask(self, key: bytes) -> None:
        self.key = key
        self.transport.write(b"GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (key, self.server.host))

    def data_received(self, data: bytes) -> None:
        if self.key is None:
            return self.server.broken(self, "origin sent bytes unasked")
        if self.want < 0:
            buf = self.buf + data if self.buf else data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            self.head = buf[:end]  # as sent: the rules variant reads its fields (`Ruled.stored`)
            head = self.head.lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                return self.server.broken(self, "origin answered without a Content-Length")
            stop = head.find(b"\r\n", at + 2)
            self.want = int(head[at + 17:stop if stop > 0 else len(head)])
            self.status = int(head[9:12])
            self.close = b"\r\nconnection: close" in head
            self.buf, data = b"", buf[end + 4:]
            self.chunks, self.got = [data], len(data)
        else:
            self.chunks.append(data)
            self.got += len(data)
        if self.got < self.want:
            return
        if self.got > self.want:
            return self.server.broken(self, "origin sent more than its Content-Length")
        body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        key, self.key, self.want, self.chunks = self.key, None, -1, []
        self.server.answered(self, key, self.status, body, self.close)

    def connection_lost(self, exc) -> None:
        self.server.lost(self)


class Bare:
    """The index, the origin pool and the files: what every cache that stores what it serves keeps."""

    def __init__(self, upstream: tuple[str, int], folder: Path) -> None:
        self.upstream = upstream
        self.host = upstream[0].encode()
        self.index: dict[bytes, tuple[bytes, int, int]] = {}  # key -> (file, body offset, body length)
        self.filling: dict[bytes, list[Client]] = {}
        self.waiting: deque[bytes] = deque()
        self.idle: list[Origin] = []
        self.busy: set[Origin] = set()
        self.opening = 0
        self.count = 0
        self.dirs = []
        for n in range(256):
            d = folder / "objects" / f"{n:02x}"
            d.mkdir(parents=True, exist_ok=True)
            self.dirs.append(os.fsencode(d))
        import google_crc32c
        self.crc = google_crc32c.value

    def find(self, key: bytes, head: bytes) -> tuple[bytes, int, int] | None:
        """What is stored under the request's path (`head`: the request's head, which `Ruled` reads too)."""
        return self.index.get(key)

    def hit(self, found: tuple[bytes, int, int]) -> bytes:
        path, offset, size = found
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            body = os.pread(fd, size, offset)
        finally:
            os.close(fd)
        return OK % (size, b"HIT") + body

    def miss(self, client: Client, key: bytes) -> None:
        joined = self.filling.get(key)
        if joined is not None:
            joined.append(client)
            return
        self.filling[key] = [client]
        if self.idle:
            conn = self.idle.pop()
            self.busy.add(conn)
            conn.ask(key)
            return
        self.waiting.append(key)
        if len(self.busy) + self.opening < MAX_ORIGIN_CONNECTIONS:
            self.open()

    def open(self) -> None:
        self.opening += 1
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.create_connection(lambda: Origin(self), *self.upstream))
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task) -> None:
        self.opening -= 1
        if task.cancelled() or task.exception() is not None:
            print(f"bare: cannot reach the origin: {task.exception() if not task.cancelled() else 'cancelled'}",
                  file=sys.stderr, flush=True)
            if not self.busy and not self.opening:  # nothing left that would take the waiting keys
                while self.waiting:
                    self.fail(self.waiting.popleft(), b"origin unreachable")

    def ready(self, conn: Origin) -> None:
        if self.waiting:
            self.busy.add(conn)
            conn.ask(self.waiting.popleft())
        else:
            self.busy.discard(conn)
            self.idle.append(conn)

    def answered(self, conn: Origin, key: bytes, status: int, body: bytes, close: bool) -> None:
        answer = self.stored(conn, key, body) if status == 200 else plain(status, body)
        for client in self.filling.pop(key):
            client.answer(answer)
        if close:
            self.busy.discard(conn)
            conn.transport.close()
        else:
            self.ready(conn)

    def stored(self, conn: Origin, key: bytes, body: bytes) -> bytes:
        """A 200's body stored under `key`, and the answer to its clients."""
        n = self.count = self.count + 1
        path = b"%s/%d.obj" % (self.dirs[n & 255], n)
        header = HEADER.pack(MAGIC, len(body), self.crc(body), len(key)) + key
        fd = os.open(path, FLAGS, 0o600)
        try:
            os.writev(fd, (header, body))
        finally:
            os.close(fd)
        self.index[key] = (path, len(header), len(body))
        return OK % (len(body), b"MISS") + body

    def fail(self, key: bytes, why: bytes) -> None:
        for client in self.filling.pop(key, ()):
            client.answer(plain(502, why, close=True), close=True)

    def broken(self, conn: Origin, why: str) -> None:
        print(f"bare: {why}", file=sys.stderr, flush=True)
        conn.transport.close()  # connection_lost fails its key

    def lost(self, conn: Origin) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        self.busy.discard(conn)
        if conn.key is not None:
            key, conn.key = conn.key, None
            self.fail(key, b"origin connection lost")
        if self.waiting and len(self.busy) + self.opening < MAX_ORIGIN_CONNECTIONS:
            self.open()


class Ruled(Bare):
    """The bare server with the node's own rules where the bare one cuts
    corners (`--rules`), its connections, request parsing and origin pool
    kept: what a cold small fill would cost were the node's per-fill layers
    (the lead chain, flights, counts, logs, metrics) gone and its rules kept.

    A request's key is the node's (front/names.py `resolve`, with `--host` for
    the Host field the bare server does not read), looked up in the node's
    store (`Store.lookup`), opened on DIR/node as cachenode/app.py
    `build_node` opens it. A miss's 200 is read as the node's own origin
    client presents it (fill/small_head.py `read_head`, fill/small_gets.py
    `SmallAnswer`), judged by the node's judgement (fill/judged.py `judge`,
    its origin and Source as front/fast_misses.py builds them, the forwarded
    fields by its `PlainFields`; a lone node chunks nothing), stored by
    `Store.put_sealed` with the keywords fill/at_once.py `store_whole` passes,
    and answered with the node's miss head (front/fast_misses.py
    `miss_head`); a hit with a stored object's head (front/plain.py
    `response_head`) and its Age, as the node's fast hits. An answer the
    judgement does not store whole at once, or the store refuses, is passed
    on unstored (the node would stream it or pass it on: none such in the
    benchmark)."""

    def __init__(self, upstream: tuple[str, int], folder: Path, host: str) -> None:
        import time

        from cachenode.cluster_view import ClusterView
        from cachenode.fill.chunking import chunked_as
        from cachenode.fill.flights import Source
        from cachenode.fill.judged import judge
        from cachenode.fill.lead import Step
        from cachenode.fill.origin import via_of
        from cachenode.fill.small_gets import SmallAnswer
        from cachenode.fill.small_head import read_head
        from cachenode.front.fast_misses import PlainFields, miss_head
        from cachenode.front.names import resolve
        from cachenode.front.plain import response_head
        from cachenode.http.vary import variant
        from cachenode.store.disk import Store
        from cachenode.store.objects import NotStored
        from nezha.config.cache import CacheSettings
        from nezha.credentials import redact_url

        super().__init__(upstream, folder)
        # The node's code, bound once: an import statement in a method costs a look-up each call.
        self.time, self.chunked_as, self.Source, self.judge, self.FILL = time.time, chunked_as, Source, judge, Step.FILL
        self.SmallAnswer, self.read_head, self.miss_head = SmallAnswer, read_head, miss_head
        self.resolve, self.response_head, self.variant, self.redact_url = resolve, response_head, variant, redact_url
        self.NotStored = NotStored
        settings = self.settings = CacheSettings(data_dir=folder / "node",
                                                 origins=[f"{host}=http://{upstream[0]}:{upstream[1]}"])
        self.node_id, self.host_name, self.table = settings.identity, host, settings.origin_table
        self.via = via_of(self.node_id)
        cluster = ClusterView(node_id=self.node_id, replicas=settings.replicas)
        self.store = Store(settings.data_dir, capacity=settings.capacity, hot_capacity=settings.hot_capacity,
                           pinned_capacity=settings.pinned_capacity, extra=cluster.holds_as_extra,
                           small_max=settings.small_object_max, sync_interval=settings.sync_interval,
                           verify_reads=settings.verify_reads)
        self.fields = PlainFields(self.via)
        self.named: dict[bytes, tuple] = {}  # a path being filled -> its target, origin, key and forwarded fields

    def find(self, key: bytes, head: bytes):
        target, origin, name = self.resolve(self.table, key.decode("latin-1"), self.host_name)
        meta = self.store.lookup(name)
        if meta is None:
            fields = self.fields.of(head)
            if fields is None:
                raise ValueError(f"not a plain request: {bytes(head)!r}")  # the benchmark sends none
            self.named[key] = (target, origin, name, fields[1])
        return meta

    def hit(self, meta) -> bytes:
        fd = os.open(self.store.data_path(meta), os.O_RDONLY | os.O_CLOEXEC)
        try:
            body = os.pread(fd, meta.size, 0)  # a sealed small file: its body first, its seal after
        finally:
            os.close(fd)
        return (self.response_head(meta, via=self.via, served_by=self.node_id)
                + b"Age: %d\r\n\r\n" % meta.age_at(self.time()) + body)

    def stored(self, conn: Origin, key: bytes, body: bytes) -> bytes:
        target, origin, name, forwarded = self.named.pop(key)
        store = self.store
        head = self.read_head(conn.head, store.small_max)
        if head is None:
            return OK % (len(body), b"PASS") + body
        url = origin.url_of(target)
        answer = self.SmallAnswer(reason=head.reason, version=head.version, pairs=head.pairs,
                                  content_length=head.length, body=body, asked=url)
        source = self.Source(url=url, what=f"origin {url}", headers=forwarded, interim=None, read_here=True)
        judged = self.judge(answer, origin=origin, source=source, stale=None, now=self.time(), fits=store.fits,
                            chunking=lambda vary, authorize: self.chunked_as(
                                200, answer.headers, answer.content_length, peer=False,
                                chunking=self.settings.chunking(origin), spread=False,
                                plain=not authorize and vary == ()))
        if judged.decision.step is not self.FILL or judged.chunk_size is not None:
            return OK % (len(body), b"PASS") + body
        vary, policy = judged.vary, judged.policy
        try:
            meta = store.put_sealed(
                body, key=name, vary=vary, variant=self.variant(vary, source.headers) if vary else "",
                url=self.redact_url(url, origin.credential_params), host=target.host, headers=judged.kept,
                stored_at=judged.now, status=200, expires_at=judged.expires_at, stale_if_error=policy.stale_if_error,
                age=judged.age, stale_while_revalidate=policy.stale_while_revalidate, authorize=judged.authorize)
        except self.NotStored:
            return OK % (len(body), b"PASS") + body
        self.count += 1
        return self.miss_head(meta, self.via) + body

    def answered(self, conn: Origin, key: bytes, status: int, body: bytes, close: bool) -> None:
        if status != 200:
            self.named.pop(key, None)  # a 200's is taken by `stored`: what a 404 named would stay for good
        super().answered(conn, key, status, body, close)

    def fail(self, key: bytes, why: bytes) -> None:
        self.named.pop(key, None)
        super().fail(key, why)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    bare = Ruled(address(args.upstream), args.dir, args.host) if args.rules else Bare(address(args.upstream), args.dir)
    if args.rules:
        from cachenode.cli import collect_young_less_often
        from nezha.logs import configure

        # The node's process as `nezha cache --log-level warning` sets it up (bench/harness.py `Node`).
        configure(level="warning", cache_loggers=True)
        collect_young_less_often()
        await bare.store.open(background=True)
    host, port = address(args.listen)
    server = await loop.create_server(lambda: Client(bare), host, port, backlog=4096)
    print("listening", flush=True)
    stop = asyncio.Event()
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    if args.rules:
        await bare.store.close()
    print(f"bare: {bare.count} objects stored", file=sys.stderr, flush=True)


# -- the benchmark ------------------------------------------------------------------

class BareServer:
    """The bare server above as a child process of the benchmark."""

    def __init__(self, children, work: Path, name: str, python: str, loop: str, rules: bool = False) -> None:
        from testkit.ports import free_port

        self.children, self.name, self.python, self.loop, self.dir = children, name, python, loop, work / name
        self.rules = rules  # with the node's rules (`Ruled`)
        self.port, self.proc = free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self, *, upstream: str) -> None:
        from bench.harness import BenchError, repo_env
        from bench.small_files import HOST

        self.dir.mkdir()
        self.proc = await self.children.spawn(
            self.python, str(REPO / "bench" / "bare_small_fill.py"), "--serve", "--loop", self.loop,
            "--listen", f"127.0.0.1:{self.port}", "--upstream", upstream.removeprefix("http://"),
            "--dir", str(self.dir), *(("--rules", "--host", HOST) if self.rules else ()),
            stdout=asyncio.subprocess.PIPE, stderr=None, cwd=REPO, env=repo_env())
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        except asyncio.TimeoutError:
            line = b""
        if line.strip() != b"listening":
            raise BenchError(f"bench/bare_small_fill.py --serve did not start (said {line!r}, exit "
                             f"{self.proc.returncode})")


def interpreter(python: str, module: str = "sys") -> tuple[str, bool]:
    """The version of `python`, and whether it imports `module`."""
    import subprocess

    version = subprocess.run([python, "-c", "import platform, sys; print(platform.python_version(), "
                              "sys.executable)"], capture_output=True, text=True, check=True).stdout.strip()
    return version, subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


async def checked(server, root: Path, paths: list[str]) -> None:
    """Each path filled then read again through `server`, both answers byte for byte the origin's file: a
    server whose answers are wrong measures nothing."""
    import aiohttp

    from bench.harness import BenchError
    from bench.small_files import get

    async with aiohttp.ClientSession() as s:
        for attempt in ("cold", "warm"):
            answers = await asyncio.gather(*(get(s, server.url, p) for p in paths))
            for p, (status, _, body) in zip(paths, answers):
                if status != 200 or body != (root / p.lstrip("/")).read_bytes():
                    raise BenchError(f"{server.name}: {attempt} {p} answered {status}, {len(body)} bytes, not "
                                     "the origin's file")


async def run(args: argparse.Namespace, work: Path, children) -> str:
    from bench.harness import BenchError, KiB, Nginx, StaticFiles, nginx_conf, nginx_version, source_version
    from bench.small_files import make_dataset, say

    version, has_uvloop = interpreter(args.python, "uvloop")
    if not interpreter(args.python, "google_crc32c")[1]:
        raise BenchError(f"{args.python} cannot import google_crc32c: pip install -e '.[test]' into it")
    say(f"bare small fill: {args.objects} objects of 16 KiB, {args.rounds} rounds of {args.seconds} s, work dir "
        f"{work}, load {os.getloadavg()}; bare server on {version}; code {source_version()}; nginx {nginx_version()}")
    kinds = [k for k in KINDS if k in args.servers]
    if "nginx" not in kinds:
        raise BenchError("--servers needs nginx: every figure is said against it")
    if not has_uvloop and "bare_uvloop" in kinds:
        kinds.remove("bare_uvloop")
        say(f"  {args.python} has no uvloop: the bare server runs on asyncio only")
    root = work / "origin-files"
    await asyncio.get_running_loop().run_in_executor(None, make_dataset, root, args.objects, 16 * KiB)
    origin = Nginx(children, work, "origin")
    await origin.start(nginx_conf(StaticFiles(root=root), **CONF))
    rps: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    user: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            fills, us, user_us = await one_run(args, work, children, root, origin.url, kind, f"{kind}-{r}")
            rps[kind].append(fills)
            cpu[kind].append(us)
            user[kind].append(user_us)
    return report(args, rps, cpu, user)


async def start(args: argparse.Namespace, work: Path, children, origin_url: str, kind: str, name: str):
    """A fresh server of `kind`: nginx proxy_cache at one worker (small_files.py's settings), the bare server
    on asyncio or uvloop, or the node at --workers 1; its folder is WORK/NAME."""
    from bench.harness import Nginx, Node, ProxyCache, nginx_conf
    from bench.small_files import HOST
    from bench.small_side_by_side import CONNECTIONS

    if kind == "nginx":
        server = Nginx(children, work, name)
        await server.start(nginx_conf(ProxyCache(upstream=origin_url, keys_zone="64m", keepalive=CONNECTIONS),
                                      **{**CONF, "workers": 1}))
        server.name = name
    elif kind.startswith("bare"):
        server = BareServer(children, work, name, args.python, "uvloop" if kind == "bare_uvloop" else "asyncio",
                            rules=kind == "bare_rules")
        await server.start(upstream=origin_url)
    else:
        server = Node(children, work, name, python=args.python)
        await server.start(origins={HOST: origin_url}, workers=1)
    return server


async def one_run(args: argparse.Namespace, work: Path, children, root: Path, origin_url: str, kind: str,
                  name: str) -> tuple[float, float, float]:
    """A fresh server's cold run: its fills/s, CPU us per fill, and the user part of those. Fresh for each run, so every run asks the
    same paths and no more than one run's objects are stored at a time (the bare server fills 20,000 a
    second on /dev/shm); its 64 warming fills, and the run's first 64 objects after it, checked exact."""
    import shutil

    import psutil

    from bench.harness import Node
    from bench.small_files import cold, path_of, say
    from bench.small_side_by_side import usage

    loop = asyncio.get_running_loop()
    server = await start(args, work, children, origin_url, kind, name)
    await checked(server, root, [path_of(n) for n in range(args.objects - 64, args.objects)])  # outside the run
    if isinstance(server, Node):
        await server.settled()
    await loop.run_in_executor(None, os.sync)
    await asyncio.sleep(1.0)
    top = psutil.Process(server.proc.pid)
    pids = [top.pid, *(c.pid for c in top.children(recursive=True))]
    before = usage(pids)
    done = await cold(children, server.url, work, 0, args.objects - 64, args.seconds, name)
    after = usage(pids)
    alive = before.keys() & after.keys()  # nginx's cache loader exits on its own
    us = sum(after[p][0] - before[p][0] for p in alive) / max(1, done.requests) * 1e6
    user = sum(after[p][2] - before[p][2] for p in alive) / max(1, done.requests) * 1e6
    waited = sum(after[p][1] - before[p][1] for p in alive) / args.seconds
    say(f"  {name:>13}: {done.rps:6.0f} fills/s, {us:4.0f} CPU us per fill ({user:.0f} user + {us - user:.0f} "
        f"system), ready but waiting for a CPU {waited:.0%} of the run")
    await checked(server, root, [path_of(n) for n in range(64)])
    await children.stop(server.proc)
    await loop.run_in_executor(None, shutil.rmtree, work / name)
    return done.rps, us, user


def report(args: argparse.Namespace, rps: dict, cpu: dict, user: dict) -> str:
    import statistics

    from bench.small_files import say

    med = {n: (statistics.median(rps[n]), statistics.median(cpu[n])) for n in rps}
    say(f"  medians of {args.rounds} rounds (fills/s, CPU us per fill, its user part):")
    for n, (f, c) in med.items():
        say(f"    {n:>11}: {f:6.0f} fills/s  {c:4.0f} us  {statistics.median(user[n]):4.0f} user  "
            f"({f / med['nginx'][0]:.3f} of nginx's fills/s, {c / med['nginx'][1]:.2f} of its CPU per fill)")
    line = "ratios:" + "".join(f" {n}_small_fill={med[n][0] / med['nginx'][0]:.3f}" for n in med if n != "nginx")
    if "node" in med and "bare" in med:
        line += f" node_over_bare={med['node'][0] / med['bare'][0]:.3f}"
    if "node" in med and "bare_rules" in med:
        line += f" node_over_bare_rules={med['node'][0] / med['bare_rules'][0]:.3f}"
    line += "".join(f" {n}_cpu_us={c:.0f}" for n, (_, c) in med.items())
    return line + "".join(f" {n}_user_us={statistics.median(user[n]):.0f}" for n in med)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", action="store_true", help="run the bare server (else: the benchmark)")
    ap.add_argument("--listen", help="--serve: host:port to accept on")
    ap.add_argument("--upstream", help="--serve: the origin's host:port")
    ap.add_argument("--dir", type=Path, help="--serve: where the objects' files go")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="--serve: the event loop")
    ap.add_argument("--rules", action="store_true", help="--serve: with the node's rules (judge, store, miss head)")
    ap.add_argument("--host", default="images.bench", help="--serve --rules: the origin's name (the Host asked)")
    ap.add_argument("--servers", type=lambda t: t.split(","), default=list(KINDS),
                    help=f"the servers compared, nginx among them (default: {','.join(KINDS)})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--objects", type=int, default=150_000, help="16 KiB files at the origin; a run may not "
                    "fill more (each run has a fresh server asking them from the first)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the bare server and of the node "
                    "(default: this one)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"), help="where the work folder goes (/dev/shm)")
    args = ap.parse_args()
    if unknown := set(args.servers) - set(KINDS):
        ap.error(f"--servers: no such server {', '.join(sorted(unknown))} (of {','.join(KINDS)})")
    if args.serve:
        if not (args.listen and args.upstream and args.dir):
            ap.error("--serve needs --listen, --upstream and --dir")
        if args.rules:
            sys.path.insert(0, str(REPO))  # the node's code
        if args.loop == "uvloop":
            import uvloop
            return uvloop.run(serve(args))
        return asyncio.run(serve(args))
    sys.path.insert(0, str(REPO))
    from bench.harness import NGINX, WRK, ensure_tool, run_bench

    ensure_tool(WRK, "wrk")
    ensure_tool(NGINX, "nginx")
    run_bench(lambda work, children: run(args, work, children), prefix=f"{args.work}/nezha-bare-small-", keep=False)


if __name__ == "__main__":
    main()
