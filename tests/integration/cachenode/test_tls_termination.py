"""Issue 13: a node with the Nezha CA serves configured origins' HTTPS itself.

A node process is given a CA made by `nezha ca init --local` and a TLS
port. Its origin `secure.example` is a local HTTPS server whose certificate
comes from a separate test CA (the "public" one, given to the node as the
origin's `ca_bundle`). Clients trust only the Nezha CA and connect to the
node under the origin's name, as a labelled pod would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import ipaddress
import os
import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from testkit.ports import free_port
from testkit.tools import unavailable
from tests.integration.cachenode.conftest import header_line, read_response

NAME = "secure.example"
BODY = os.urandom(5 * 1024 * 1024 + 3)


class HttpsOrigin:
    """A local HTTPS origin whose certificate says 127.0.0.1, from `ca`; counts what it serves."""

    def __init__(self, ca: trustme.CA, *, not_after: dt.datetime | None = None) -> None:
        self.ca = ca
        self.not_after = not_after
        self.gets: list[str] = []
        self.port = 0

    async def start(self, aiohttp_server) -> "HttpsOrigin":
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1", not_after=self.not_after).configure_cert(ctx)
        app = web.Application()
        app.router.add_get("/{name}", self.data)
        server = await aiohttp_server(app, host="127.0.0.1", ssl=ctx)
        self.port = server.port
        return self

    async def data(self, request: web.Request) -> web.Response:
        self.gets.append(request.path)
        return web.Response(body=BODY, headers={"ETag": '"v1"', "Cache-Control": "max-age=3600"})

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@pytest.fixture
def public_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def https_origin(public_ca, aiohttp_server) -> HttpsOrigin:
    return await HttpsOrigin(public_ca).start(aiohttp_server)


@pytest.fixture
def nezha_ca(tmp_path) -> Path:
    folder = tmp_path / "ca"
    subprocess.run([sys.executable, "-m", "nezha", "ca", "init", "--local", str(folder)], check=True,
                   capture_output=True)
    return folder


def node_config(tmp_path: Path, upstream: str, *, bundle: Path | None, extra: dict | None = None,
                host: str = NAME) -> Path:
    origin = {"host": host, "upstream": upstream, **({"ca_bundle": str(bundle)} if bundle else {}), **(extra or {})}
    path = tmp_path / f"node-{len(list(tmp_path.glob('node-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"origins": [origin]}))
    return path


@pytest.fixture
def tls_node(tmp_path, node_process, nezha_ca, public_ca, https_origin, session):
    bundle = tmp_path / "public-ca.pem"
    public_ca.cert_pem.write_to_path(str(bundle))

    async def start(*, upstream: str | None = None, with_bundle: bool = True, extra: dict | None = None,
                    host: str = NAME, args: tuple[str, ...] = ()):
        config = node_config(tmp_path, upstream or https_origin.url, bundle=bundle if with_bundle else None,
                             extra=extra, host=host)
        tls_port = free_port()
        node = node_process(None, args=("--config", str(config), "--tls-listen", f"127.0.0.1:{tls_port}",
                                        "--ca-cert", str(nezha_ca / "ca.crt"), "--ca-key", str(nezha_ca / "ca.key"),
                                        *args))
        node.tls_port = tls_port
        await node.ready(session)
        return node

    return start


def trusting_nezha(nezha_ca: Path) -> ssl.SSLContext:
    """A client context that trusts the Nezha CA alone (as a pod given only that would)."""
    return ssl.create_default_context(cafile=str(nezha_ca / "ca.crt"))


async def https_get(port: int, ctx: ssl.SSLContext, path: str = "/data.bin", *, server_hostname: str | None = NAME,
                    host: str = NAME) -> tuple[bytes, bytes, x509.Certificate]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=server_hostname)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body, x509.load_der_x509_certificate(der)


async def test_a_client_trusting_the_nezha_ca_downloads_cold_then_warm_with_one_origin_fetch(
        tls_node, https_origin, nezha_ca):
    node = await tls_node()
    ctx = trusting_nezha(nezha_ca)
    head, body, leaf = await https_get(node.tls_port, ctx)
    assert head.startswith(b"HTTP/1.1 200") and hashlib.sha256(body).digest() == hashlib.sha256(BODY).digest()
    assert header_line(head, b"X-Nezha-Cache") == b"miss"
    head, body, _ = await https_get(node.tls_port, ctx)
    assert head.startswith(b"HTTP/1.1 200") and body == BODY
    assert header_line(head, b"X-Nezha-Cache") == b"hit"
    assert https_origin.gets == ["/data.bin"]
    # The leaf: exactly the name, ECDSA P-256, signed by the Nezha CA, valid for days.
    ca = x509.load_pem_x509_certificate((nezha_ca / "ca.crt").read_bytes())
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == [NAME]
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey) and leaf.public_key().curve.name == "secp256r1"
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= dt.timedelta(days=8)
    terminated = [e for e in node.events() if e.get("event") == "request_completed" and e.get("host") == NAME]
    assert len(terminated) == 2


async def test_https_and_http_requests_for_one_url_are_distinct_objects(tls_node, https_origin, nezha_ca, session):
    node = await tls_node()
    _, body, _ = await https_get(node.tls_port, trusting_nezha(nezha_ca))
    assert body == BODY
    async with session.get(f"http://127.0.0.1:{node.port}/data.bin", headers={"Host": NAME}) as r:
        assert r.status == 200 and await r.read() == BODY
        assert r.headers["X-Nezha-Cache"] == "miss"  # http://secure.example/data.bin is another key
    assert https_origin.gets == ["/data.bin", "/data.bin"]


async def test_a_name_outside_the_table_or_no_name_is_refused_nothing_minted_nothing_fetched(
        tls_node, https_origin, nezha_ca, tmp_path):
    node = await tls_node()
    ctx = trusting_nezha(nezha_ca)
    with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
        await https_get(node.tls_port, ctx, server_hostname="evil.example", host="evil.example")
    ctx.check_hostname = False
    with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE"):
        await https_get(node.tls_port, ctx, server_hostname=None)
    assert https_origin.gets == []
    leaves = tmp_path / "data" / "leaves"
    assert not leaves.exists() or list(leaves.iterdir()) == []
    refused = [e for e in node.events() if e.get("event") == "tls_refused"]
    assert [e["name"] for e in refused] == ["evil.example", None]


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that signs itself: the kind a careless origin serves."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "origin")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "self.crt", tmp_path / "self.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_a_self_signed_origin_is_a_502_naming_why_and_nothing_is_served(
        tls_node, nezha_ca, aiohttp_server, tmp_path):
    cert, key = self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    app = web.Application()
    async def never(request: web.Request) -> web.Response:
        raise AssertionError("a client reached an origin whose certificate did not verify")

    app.router.add_get("/{name}", never)
    server = await aiohttp_server(app, host="127.0.0.1", ssl=ctx)
    node = await tls_node(upstream=f"https://127.0.0.1:{server.port}", with_bundle=False)  # the system store
    head, body, _ = await https_get(node.tls_port, trusting_nezha(nezha_ca))
    assert head.startswith(b"HTTP/1.1 502"), head
    assert re.search(rb"certificate does not verify: self.signed certificate", body), body


async def test_an_expired_origin_certificate_is_a_502_naming_why(tls_node, nezha_ca, aiohttp_server, tmp_path):
    public = trustme.CA()
    origin = await HttpsOrigin(public, not_after=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)
                               ).start(aiohttp_server)
    bundle = tmp_path / "expired-origin-ca.pem"
    public.cert_pem.write_to_path(str(bundle))
    node = await tls_node(upstream=origin.url, with_bundle=False, extra={"ca_bundle": str(bundle)})
    head, body, _ = await https_get(node.tls_port, trusting_nezha(nezha_ca))
    assert head.startswith(b"HTTP/1.1 502"), head
    assert b"certificate does not verify: certificate has expired" in body, body
    assert origin.gets == []


async def test_a_restart_presents_the_leaf_it_minted_before(tls_node, https_origin, nezha_ca):
    node = await tls_node()
    _, _, first = await https_get(node.tls_port, trusting_nezha(nezha_ca))
    node.stop()
    again = await tls_node()
    _, body, second = await https_get(again.tls_port, trusting_nezha(nezha_ca))
    assert body == BODY and second.serial_number == first.serial_number
    assert [e for e in again.events() if e.get("event") == "leaf_minted"] == []


@pytest.mark.parametrize("flag, value, message", [
    ("--ca-key", "missing.key", r"--ca-key \S*missing.key: cannot read it: No such file"),
    ("--ca-key", "ca.crt", r"not a PEM certificate and EC key"),
])
def test_a_ca_that_cannot_be_read_stops_the_node_before_it_binds_or_writes(
        nezha_ca, tmp_path, flag, value, message):
    config = node_config(tmp_path, "https://127.0.0.1:9", bundle=None)
    port, tls_port = free_port(), free_port()
    args = {"--ca-cert": str(nezha_ca / "ca.crt"), "--ca-key": str(nezha_ca / "ca.key"), flag: str(nezha_ca / value)}
    done = subprocess.run(
        [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--tls-listen",
         f"127.0.0.1:{tls_port}", "--data-dir", str(tmp_path / "data"), "--config", str(config),
         *[x for pair in args.items() for x in pair]], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), done.stderr
    assert not (tmp_path / "data").exists()


async def test_unmodified_curl_trusting_the_nezha_ca_downloads_through_the_node(tls_node, https_origin, nezha_ca,
                                                                                tmp_path):
    if shutil.which("curl") is None:
        unavailable("curl is not installed (bash .ci/run installs it)")
    node = await tls_node()
    for expected in ("miss", "hit"):
        out = tmp_path / f"curl-{expected}.bin"
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--fail", "-D", "-", "-o", str(out), "--cacert", str(nezha_ca / "ca.crt"),
            "--resolve", f"{NAME}:{node.tls_port}:127.0.0.1", f"https://{NAME}:{node.tls_port}/data.bin",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        headers, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        assert f"x-nezha-cache: {expected}".encode() in headers.lower()
        assert out.read_bytes() == BODY
    assert https_origin.gets == ["/data.bin"]


async def test_a_leaf_renewed_while_a_download_runs_on_it_leaves_that_download_whole(tmp_path):
    """The port with real leaves and a clock: a connection keeps the leaf it began with, new ones get the new."""
    from aiohttp import web as aioweb

    from cachenode.tls.certificates import Leaves
    from cachenode.tls.port import Terminate, TlsPort
    from nezha.pki import make_ca

    real_now = dt.datetime.now(dt.timezone.utc)
    ca = make_ca(now=real_now - dt.timedelta(days=30), name="nezha-ca")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    clock = [real_now - dt.timedelta(days=6)]  # the first leaf: minted six days ago, one day left
    leaves = Leaves(ca, certificate_name=lambda name: name if name == NAME else None, folder=tmp_path / "leaves",
                    clock=lambda: clock[0])
    chunks = [os.urandom(64 * 1024) for _ in range(32)]
    halfway = asyncio.Event()

    async def slow(request: aioweb.Request) -> aioweb.StreamResponse:
        resp = aioweb.StreamResponse()
        resp.content_length = sum(map(len, chunks))
        await resp.prepare(request)
        for i, chunk in enumerate(chunks):
            await resp.write(chunk)
            if i == len(chunks) // 2:
                await halfway.wait()  # the renewal happens while this download is half done
        return resp

    app = aioweb.Application()
    app.router.add_get("/slow", slow)
    runner = aioweb.AppRunner(app)
    await runner.setup()
    loop = asyncio.get_running_loop()

    async def adopt(sock, context):
        await loop.connect_accepted_socket(runner.server, sock, ssl=context)

    port = TlsPort(lambda name: Terminate(leaves.context_for(name)) if name == NAME else None, adopt=adopt)
    await port.start("127.0.0.1", 0)
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port, ssl=ctx, server_hostname=NAME)
        first = x509.load_der_x509_certificate(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
        writer.write(f"GET /slow HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        got = await reader.readexactly(len(chunks[0]) * 4)

        clock[0] = real_now  # one day left, under the two-day margin: the next handshake renews
        halfway.set()
        _, _, second = await https_get(port.port, ctx, "/slow")
        assert second.serial_number != first.serial_number and leaves.minted == 2
        got += await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert got == b"".join(chunks)  # the running download, on the old leaf, ended whole
    finally:
        await port.close()
        await runner.cleanup()


async def test_names_under_a_wildcard_origin_share_one_wildcard_leaf_and_keep_their_own_keys(
        tls_node, https_origin, nezha_ca):
    node = await tls_node(host="*.buckets.example")
    ctx = trusting_nezha(nezha_ca)
    for bucket in ("b1.buckets.example", "b2.buckets.example"):
        head, body, leaf = await https_get(node.tls_port, ctx, server_hostname=bucket, host=bucket)
        assert head.startswith(b"HTTP/1.1 200") and body == BODY
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == ["*.buckets.example"]
    assert https_origin.gets == ["/data.bin", "/data.bin"]  # two hosts, two objects
    with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):  # two labels under: not covered, not served
        await https_get(node.tls_port, ctx, server_hostname="a.b1.buckets.example", host="a.b1.buckets.example")
    minted = [e for e in node.events() if e.get("event") == "leaf_minted"]
    assert [e["name"] for e in minted] == ["*.buckets.example"]


async def test_silent_tls_connections_share_the_connection_cap_and_give_way_to_real_clients(
        tls_node, https_origin, nezha_ca, session):
    node = await tls_node(args=("--max-connections", "8"))
    silent = [await asyncio.open_connection("127.0.0.1", node.tls_port) for _ in range(20)]  # never say hello
    await asyncio.sleep(0.3)
    head, body, _ = await https_get(node.tls_port, trusting_nezha(nezha_ca))  # the stalest silent one gives way
    assert head.startswith(b"HTTP/1.1 200") and body == BODY
    async with session.get(f"http://127.0.0.1:{node.port}/healthz") as r:  # and the plain port still answers
        assert r.status == 200
    # Room was made by reclaiming silent ones at the cap, not by their ClientHello wait (30 s) running out:
    # the order of the node's events says which, where the time it took would depend on the machine's load.
    events = node.events()
    [served] = [e["timestamp"] for e in events
                if e.get("event") == "request_completed" and e.get("path") == "/data.bin"]
    assert any(e["timestamp"] < served for e in events if e.get("event") == "connection_reclaimed")
    assert not [e for e in events if e.get("event") == "tls_refused" and e["timestamp"] < served]
    # At most 8 held at once: the rest are closed to make room, at once
    # (those reclaimed before their task ran were left open until the GC
    # closed them, up to 30 s later under load). Read all of them together
    # until 12 have closed; 8 stay open for good.
    reads = [asyncio.ensure_future(reader.read()) for reader, _ in silent]
    closed = 0
    try:
        async with asyncio.timeout(30):
            for done in asyncio.as_completed(reads):
                closed += await done == b""
                if closed >= 12:
                    break
    except TimeoutError:
        pass
    finally:
        for read in reads:
            read.cancel()
        for _, writer in silent:
            writer.close()
    assert closed >= 12
    assert any(e.get("event") == "connection_reclaimed" for e in node.events())


async def test_with_two_workers_both_make_handshakes_and_every_https_answer_is_exact(
        tls_node, https_origin, nezha_ca):
    """`--workers 2` (issue 26, item 4): the follower ends the TLS of the
    connections the kernel gives it, serves their plain hits itself (read and
    written through TLS), and passes anything else to the primary in the
    clear, where it is an https request like any other."""
    import aiohttp

    from testkit.waits import wait_for

    node = await tls_node(args=("--workers", "2"))
    await wait_for(lambda: any(e.get("event") == "worker_listening" for e in node.events()), timeout=60)
    ctx = trusting_nezha(nezha_ca)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
        async def metric(name: str) -> float:
            # One kept-alive connection: handed to the primary at most once, on the first call.
            async with one.get(f"http://127.0.0.1:{node.port}/metrics") as r:
                found = re.search("^" + re.escape(name) + r" ([0-9.e+]+)$", await r.text(), re.M)
            assert found, name
            return float(found.group(1))

        async def kept_alive_get(path: str, second: str = "") -> tuple[bytes, bytes]:
            """Two GETs on one TLS connection without `Connection: close`, as
            curl sends them: plain requests, the fast path's (the second with
            the fields `second`, a range). The second's answer."""
            reader, writer = await asyncio.open_connection("127.0.0.1", node.tls_port, ssl=ctx, server_hostname=NAME)
            try:
                for extra in ("", second):
                    writer.write(f"GET {path} HTTP/1.1\r\nHost: {NAME}\r\nUser-Agent: curl/8\r\n{extra}\r\n"
                                 .encode())
                    head, body = await asyncio.wait_for(read_response(reader), 20)
            finally:
                writer.close()
            return head, body

        labels = []
        for _ in range(16):
            head, body = await kept_alive_get("/data.bin")
            assert head.startswith(b"HTTP/1.1 200") and body == BODY
            labels.append(header_line(head, b"X-Nezha-Cache"))
        assert labels == [b"hit"] * 16  # the first connection's first answer was the miss
        assert https_origin.gets == ["/data.bin"]
        fast = [e for e in node.events() if e.get("event") == "request_completed" and e.get("fast")]
        assert fast and {e["worker"] for e in fast} == {1}, "the follower served TLS hits itself"
        assert all(e["bytes"] == len(BODY) for e in fast)

        handed = await metric("nezha_worker_handovers_total")
        for i in range(16):  # misses: the follower's go to the primary, bridged
            head, body, _ = await https_get(node.tls_port, ctx, f"/cold-{i}")
            assert head.startswith(b"HTTP/1.1 200") and body == BODY
            assert header_line(head, b"X-Nezha-Cache") == b"miss"
        assert await metric("nezha_worker_handovers_total") > handed
        assert await metric('nezha_tls_connections_total{outcome="terminated"}') == 32
        assert await metric('nezha_requests_total{cache="hit"}') == 31

        # A range over TLS: the follower reads it from its offset and writes it through TLS itself.
        served = len(node.events())

        def ranged_fast() -> list[dict]:
            return [e for e in node.events()[served:] if e.get("event") == "request_completed" and e.get("fast")
                    and e.get("status") == 206]

        for i in range(40):  # until the kernel has given the follower some (each connection: either worker)
            head, body = await kept_alive_get("/data.bin", second=f"Range: bytes={1_000_003 + i}-4000000\r\n")
            assert head.startswith(b"HTTP/1.1 206") and body == BODY[1_000_003 + i:4_000_001]
            if i >= 7 and ranged_fast():
                break
        assert ranged_fast() and {e["worker"] for e in ranged_fast()} == {1}
        assert await metric('nezha_requests_total{cache="hit"}') == 31 + 2 * (i + 1)
