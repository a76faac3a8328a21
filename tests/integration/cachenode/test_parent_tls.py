"""Issue 23: a sidecar's TLS port passes connections through to its parent's TLS port, by server name.

The parent is a node process holding the Nezha CA (it terminates, as the
cluster tier does); the child holds no CA and is given `--parent` and
`--parent-tls-port`. Clients trust the Nezha CA alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import ssl

from testkit.ports import free_port
from testkit.tools import unavailable
from tests.integration.cachenode.conftest import header_line, until
from tests.integration.cachenode.test_tls_termination import (BODY, NAME, https_get, https_origin, nezha_ca,
                                                              node_config, public_ca, tls_node)

__all__ = ["https_origin", "nezha_ca", "public_ca", "tls_node"]  # fixtures, used by name


async def child_of(parent, node_process, tmp_path, session, *, parent_tls_port: int, upstream: str):
    """A sidecar: the same origin name, no CA, the parent's plain and TLS ports."""
    config = node_config(tmp_path, upstream, bundle=None)
    tls_port = free_port()
    data_dir = tmp_path / "child-data"  # its own disk: NodeProcess's default folder is the parent's
    child = node_process(None, args=("--config", str(config), "--tls-listen", f"127.0.0.1:{tls_port}",
                                     "--data-dir", str(data_dir),
                                     "--parent", f"http://127.0.0.1:{parent.port}",
                                     "--parent-tls-port", str(parent_tls_port)))
    child.tls_port = tls_port
    child.data_dir = data_dir
    await child.ready(session)
    return child


async def test_unmodified_curl_through_the_sidecar_reaches_the_terminating_parent(
        tls_node, https_origin, nezha_ca, node_process, tmp_path, session):
    if shutil.which("curl") is None:
        unavailable("curl is not installed (bash .ci/run installs it)")
    parent = await tls_node()
    child = await child_of(parent, node_process, tmp_path, session, parent_tls_port=parent.tls_port,
                           upstream=https_origin.url)
    for expected in ("miss", "hit"):
        out = tmp_path / f"curl-{expected}.bin"
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--fail", "-D", "-", "-o", str(out), "--cacert", str(nezha_ca / "ca.crt"),
            "--resolve", f"{NAME}:{child.tls_port}:127.0.0.1", f"https://{NAME}:{child.tls_port}/data.bin",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        headers, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        assert f"x-nezha-cache: {expected}".encode() in headers.lower()  # the parent's: it terminated
        assert out.read_bytes() == BODY
    assert https_origin.gets == ["/data.bin"]
    # Each connection's line is written once it ends, which may be just after curl exits.
    await until(lambda: len([e for e in child.events() if e["event"] == "tls_relayed"]) >= 2)
    relayed = [e for e in child.events() if e["event"] == "tls_relayed"]
    assert [e["target"] for e in relayed] == [f"127.0.0.1:{parent.tls_port}"] * 2
    assert not (child.data_dir / "leaves").exists()  # the sidecar never holds a key for a name


async def test_with_the_parents_tls_port_down_the_sidecar_passes_tls_to_the_origin(
        https_origin, public_ca, node_process, tmp_path, session):
    class Down:  # a parent that is not running at all
        port = free_port()

    child = await child_of(Down, node_process, tmp_path, session, parent_tls_port=free_port(),
                           upstream=https_origin.url)
    ctx = ssl.create_default_context(cafile=None)
    public_ca.configure_trust(ctx)
    ctx.check_hostname = False  # the origin's certificate names 127.0.0.1; its issuer is what is checked
    head, body, _ = await https_get(child.tls_port, ctx)
    assert head.startswith(b"HTTP/1.1 200") and hashlib.sha256(body).digest() == hashlib.sha256(BODY).digest()
    assert header_line(head, b"X-Nezha-Cache") is None  # the origin itself answered
    assert https_origin.gets == ["/data.bin"]
    await until(lambda: any(e["event"] == "tls_relayed" for e in child.events()))
    fallbacks = [e for e in child.events() if e["event"] == "parent_fallback"]
    assert [(e["reason"], e["tls"]) for e in fallbacks] == [("unreachable", True)]
    async with session.get(f"http://127.0.0.1:{child.port}/metrics") as r:
        assert 'nezha_parent_fallbacks_total{reason="unreachable"} 1.0' in await r.text()
