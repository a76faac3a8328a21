"""Issue 13, first part: an aliased host's HTTPS traffic reaches the real host through the cache's port 443.

A local TLS origin has a certificate for `secure.example` from a test CA.
Clients connect to the cache's address under that name (unmodified curl
and wget in a mount namespace whose /etc/hosts carries the webhook's
hostAlias) and must get the origin's own certificate and bytes. Names the
node does not serve, no name, or no TLS at all are refused, and nothing is
contacted for them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
import time

import pytest
import trustme
from aiohttp import web

from cachenode.tls.port import Relay, TlsPort, passthrough_target
from testkit.ports import free_port
from testkit.waits import wait_for
from testkit.tools import unavailable
from tests.integration.cachenode.conftest import until
from tests.pod_command import cover_for_hosts, run_pod_command

NAME = "secure.example"
ALIAS_IP = "127.0.0.21"
BODY = os.urandom(3 * 1024 * 1024 + 17)


class TlsOrigin:
    def __init__(self, ca: trustme.CA) -> None:
        self.ca = ca
        self.accepted = 0
        self.uploads: list[str] = []
        self.port = 0

    async def start(self, aiohttp_server) -> "TlsOrigin":
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(NAME).configure_cert(ctx)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/data.bin", self.data)
        app.router.add_put("/upload", self.upload)
        app.on_response_prepare.append(self._count)
        server = await aiohttp_server(app, host="127.0.0.1", ssl=ctx)
        self.port = server.port
        return self

    async def data(self, request: web.Request) -> web.Response:
        return web.Response(body=BODY)

    async def _count(self, request, response) -> None:
        self.accepted += 1

    async def upload(self, request: web.Request) -> web.Response:
        self.uploads.append(hashlib.sha256(await request.read()).hexdigest())
        return web.Response(text=self.uploads[-1])


@pytest.fixture
def ca():
    return trustme.CA()


@pytest.fixture
async def tls_origin(ca, aiohttp_server):
    return await TlsOrigin(ca).start(aiohttp_server)


@pytest.fixture(params=[True, False], ids=["splice", "user-space"])
async def relay(tls_origin, request):
    relays = []

    async def start(host: str = "127.0.0.1", port: int = 0, *, hello_timeout: float = 30.0,
                    targets: dict | None = None) -> TlsPort:
        table = targets if targets is not None else {NAME: ("127.0.0.1", tls_origin.port)}
        r = TlsPort(lambda name: Relay(*table[name]) if name in table else None,
                    hello_timeout=hello_timeout, connect_timeout=1.0, splice=request.param)
        await r.start(host, port)
        relays.append(r)
        return r

    yield start
    for r in relays:
        await r.close()


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


async def https_get(port: int, ctx: ssl.SSLContext, *, server_hostname: str | None = NAME,
                    request: bytes | None = None, half_close: bool = False) -> tuple[bytes, bytes, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=server_hostname)
    try:
        cert = writer.get_extra_info("peercert")
        writer.write(request or f"GET /data.bin HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        if half_close:
            writer.write_eof()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body, cert


async def test_a_client_of_an_allowed_name_gets_the_real_hosts_certificate_and_bytes(relay, tls_origin, ca):
    r = await relay()
    head, body, cert = await https_get(r.port, client_context(ca))
    assert head.startswith(b"HTTP/1.1 200") and body == BODY
    assert ("DNS", NAME) in cert["subjectAltName"]  # the origin's own: the node did not terminate TLS
    await until(lambda: r.counts == {"terminated": 0, "relayed": 1, "refused": 0, "failed": 0})


async def test_bytes_flow_both_ways_and_a_half_close_still_gets_the_answer(relay, tls_origin, ca):
    r = await relay()
    payload = os.urandom(2 * 1024 * 1024)
    request = (f"PUT /upload HTTP/1.1\r\nHost: {NAME}\r\nContent-Length: {len(payload)}\r\n"
               f"Connection: close\r\n\r\n").encode() + payload
    head, body, _ = await https_get(r.port, client_context(ca), request=request)
    assert head.startswith(b"HTTP/1.1 200") and body.decode() == hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize("server_hostname, reason", [("elsewhere.example", "UNRECOGNIZED_NAME"),
                                                     (None, "HANDSHAKE_FAILURE")])
async def test_a_name_that_is_not_an_origin_or_no_name_is_refused_and_nothing_is_contacted(
        relay, tls_origin, ca, server_hostname, reason):
    r = await relay()
    ctx = client_context(ca)
    if server_hostname is None:
        ctx.check_hostname = False
    with pytest.raises(ssl.SSLError, match=reason):
        await https_get(r.port, ctx, server_hostname=server_hostname)
    assert r.counts["refused"] == 1 and tls_origin.accepted == 0


async def test_plain_http_on_the_tls_port_is_closed_without_contacting_anyone(relay, tls_origin):
    r = await relay()
    reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
    writer.write(f"GET /data.bin HTTP/1.1\r\nHost: {NAME}\r\n\r\n".encode())
    assert await asyncio.wait_for(reader.read(), 2) == b""
    writer.close()
    assert r.counts["refused"] == 1 and tls_origin.accepted == 0


async def test_a_client_that_says_nothing_is_closed_after_the_hello_timeout(relay):
    r = await relay(hello_timeout=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
    started = time.monotonic()
    # The relay's timer closes it, not the test's guard (which would raise).
    assert await asyncio.wait_for(reader.read(), 60) == b""
    assert time.monotonic() - started > 0.25
    assert r.counts["refused"] == 1
    writer.close()


async def test_an_origin_that_cannot_be_reached_ends_the_client_connection_at_once(relay, ca):
    r = await relay(targets={NAME: ("127.0.0.1", 9)})  # nothing listens on the discard port
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await https_get(r.port, client_context(ca))
    assert r.counts["failed"] == 1


async def test_stalled_hellos_leave_room_for_a_real_client(relay, tls_origin, ca):
    r = await relay()
    ctx = client_context(ca)
    stalled = []
    for _ in range(100):
        reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
        writer.write(bytes([22, 3, 1, 2, 0]) + b"\x01\x00")  # half a ClientHello, then nothing
        stalled.append(writer)
    head, body, _ = await https_get(r.port, ctx)
    # Served while all 100 hellos are still held (their timer is 30 s away):
    # the real client waited on none of them.
    assert body == BODY
    assert r.counts["refused"] == 0
    for w in stalled:
        w.close()


def test_where_a_connection_goes_follows_the_origin_table():
    assert passthrough_target("storage.googleapis.com", "https://storage.googleapis.com") == (
        "storage.googleapis.com", 443)
    assert passthrough_target("h.example", "https://10.0.0.5:8443") == ("10.0.0.5", 8443)
    # An http:// upstream says nothing about its TLS side: the host's own port 443.
    assert passthrough_target("download.tensorflow.org", "http://download.tensorflow.org") == (
        "download.tensorflow.org", 443)


@pytest.fixture
async def alias_relay(relay, request):
    """The relay on port 443 of the address the webhook's hostAlias gives the name."""
    cover_for_hosts(request)
    try:
        return await relay(ALIAS_IP, 443)
    except PermissionError as e:
        unavailable(f"cannot listen on {ALIAS_IP}:443 (not root): {e}")


def pod(command: list[str]) -> dict:
    return {"metadata": {"name": "job-x"},
            "spec": {"hostAliases": [{"ip": ALIAS_IP, "hostnames": [NAME]}], "containers": [{"command": command}]}}


async def test_unmodified_curl_downloads_an_aliased_https_host_through_the_cache(alias_relay, tls_origin, ca, tmp_path):
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    await run_pod_command(pod(["curl", "-sSf", "-o", "data.bin", f"https://{NAME}/data.bin"]), tmp_path / "curl",
                          env={"CURL_CA_BUNDLE": str(bundle)})
    assert hashlib.sha256((tmp_path / "curl" / "data.bin").read_bytes()).digest() == hashlib.sha256(BODY).digest()
    await until(lambda: alias_relay.counts["relayed"] == 1)


async def test_unmodified_wget_downloads_an_aliased_https_host_through_the_cache(alias_relay, tls_origin, ca, tmp_path):
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    wgetrc = tmp_path / "wgetrc"
    wgetrc.write_text(f"ca_certificate = {bundle}\n")  # Debian's wget (GnuTLS) ignores SSL_CERT_FILE
    await run_pod_command(pod(["wget", "-q", "-O", "data.bin", f"https://{NAME}/data.bin"]), tmp_path / "wget",
                          env={"WGETRC": str(wgetrc)})
    assert (tmp_path / "wget" / "data.bin").read_bytes() == BODY
    await until(lambda: alias_relay.counts["relayed"] == 1)


@pytest.mark.parametrize("workers", [1, 2])
async def test_nezha_cache_with_tls_listen_relays_its_origins_and_refuses_the_rest(
        node_process, tls_origin, ca, session, workers):
    tls_port = free_port()
    node = node_process("http://127.0.0.1:9", args=("--origin", f"{NAME}=https://127.0.0.1:{tls_origin.port}",
                                                    "--tls-listen", f"127.0.0.1:{tls_port}", "--workers", str(workers)))
    await node.ready(session)
    if workers > 1:  # every worker relays what lands on its TLS port (issue 26, item 4)
        await wait_for(lambda: any(e["event"] == "worker_listening" for e in node.events()), timeout=60)
    [listening] = [e for e in node.events() if e["event"] == "node_listening"]
    assert listening["tls_listen"] == f"127.0.0.1:{tls_port}"
    relayed = 1 if workers == 1 else 16
    for _ in range(relayed):
        head, body, cert = await https_get(tls_port, client_context(ca))
        assert body == BODY and ("DNS", NAME) in cert["subjectAltName"]
    with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
        await https_get(tls_port, client_context(ca), server_hostname="www.cs.toronto.edu.evil")
    async with session.get(f"http://127.0.0.1:{node.port}/metrics") as r:
        text = await r.text()
    assert f'nezha_tls_connections_total{{outcome="relayed"}} {relayed}.0' in text
    assert 'nezha_tls_connections_total{outcome="refused"} 1.0' in text
    if workers > 1:
        assert {e.get("worker") for e in node.events() if e["event"] == "tls_relayed"} == {0, 1}
