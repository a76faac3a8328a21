"""Issue 23: a node with `--parent` (a sidecar) fills from its parent tier, and from the origin when the parent fails.

Two (or three) real nodes on loopback: a child whose `parent` is the URL of
a parent node, the parent with the counting origin (tests/support_origin.py).
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
from aiohttp import web
from structlog.testing import capture_logs

from testkit.ports import free_port
from tests.integration.cachenode.conftest import HOST, until

BODY = os.urandom(300 * 1024 + 7)


def sample(node, name: str, **labels: str) -> float:
    """A metric of an in-process node, 0 when it was never counted."""
    return node.node.metrics.registry.get_sample_value(name, labels or None) or 0.0


def requests_to(node) -> float:
    """Every request `node` answered (its nezha_requests_total over every outcome)."""
    total = 0.0
    for family in node.node.metrics.registry.collect():
        if family.name == "nezha_requests":
            total += sum(s.value for s in family.samples if s.name == "nezha_requests_total")
    return total


async def test_first_read_fills_the_child_from_the_parent_and_the_origin_once(make_node, origin, session, tmp_path):
    origin.put("/data.bin", BODY)
    parent = await make_node(data_dir=tmp_path / "parent", node_id="parent")
    child = await make_node(data_dir=tmp_path / "child", node_id="child", parent=parent.url)

    with capture_logs() as logs:
        status, headers, body = await child.get(session, "/data.bin")
        await child.node.settled()
        await parent.node.settled()
    assert (status, body) == (200, BODY)
    assert headers["X-Nezha-Cache"] == "miss"  # the child's own outcome: the parent is its origin
    assert origin.requests["/data.bin"] == 1
    assert requests_to(parent) == 1
    assert sample(child, "nezha_bytes_from_parent_total") == len(BODY)
    assert sample(child, "nezha_bytes_from_origin_total") == 0
    assert sample(parent, "nezha_bytes_from_origin_total") == len(BODY)
    filled = [e for e in logs if e["event"] == "fill_completed" and e["key"].endswith("/data.bin")]
    assert {(e["source"], e.get("parent_cache")) for e in filled} == {("parent", "miss"), ("origin", None)}
    # Nothing of the tiers' own protocol reaches the origin.
    assert not [n for n in origin.request_headers[0] if n.lower().startswith("x-nezha-")]
    assert origin.request_headers[0]["Via"] == "1.1 child, 1.1 parent"

    status, headers, body = await child.get(session, "/data.bin")
    assert (status, body, headers["X-Nezha-Cache"]) == (200, BODY, "hit")
    assert requests_to(parent) == 1  # the second epoch never left the child's disk
    assert origin.requests["/data.bin"] == 1


async def test_a_second_child_gets_the_object_from_the_parent_without_the_origin(make_node, origin, session, tmp_path):
    origin.put("/data.bin", BODY)
    parent = await make_node(data_dir=tmp_path / "parent")
    first = await make_node(data_dir=tmp_path / "first", parent=parent.url)
    second = await make_node(data_dir=tmp_path / "second", parent=parent.url)

    assert (await first.get(session, "/data.bin"))[2] == BODY
    await parent.node.settled()
    status, headers, body = await second.get(session, "/data.bin")
    assert (status, body, headers["X-Nezha-Cache"]) == (200, BODY, "miss")
    assert origin.requests["/data.bin"] == 1
    assert sample(parent, "nezha_cache_hits_total") == 1


async def test_a_parent_that_cannot_be_reached_sends_the_child_to_the_origin(make_node, origin, session, tmp_path):
    origin.put("/data.bin", BODY)
    origin.put("/other.bin", b"other")
    child = await make_node(data_dir=tmp_path / "child", parent=f"http://127.0.0.1:{free_port()}")

    with capture_logs() as logs:
        status, headers, body = await child.get(session, "/data.bin")
    assert (status, body, headers["X-Nezha-Cache"]) == (200, BODY, "miss")
    assert origin.requests["/data.bin"] == 1
    assert sample(child, "nezha_parent_fallbacks_total", reason="unreachable") == 1
    [event] = [e for e in logs if e["event"] == "parent_fallback"]
    assert event["reason"] == "unreachable" and event["host"] == HOST and event["path"] == "/data.bin"
    assert "cannot connect" in event["error"]
    # Moments later the parent is not tried again: a dead Service costs no connect per miss.
    assert (await child.get(session, "/other.bin"))[2] == b"other"
    assert sample(child, "nezha_parent_fallbacks_total", reason="down") == 1
    await child.node.settled()
    assert (await child.get(session, "/data.bin"))[1]["X-Nezha-Cache"] == "hit"


async def test_a_parent_answering_5xx_of_its_own_sends_the_child_to_the_origin(make_node, origin, session, tmp_path,
                                                                              aiohttp_server):
    origin.put("/data.bin", BODY)
    asked: list[str] = []

    async def broken(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Host", ""))
        return web.Response(status=503, text="overloaded\n")

    app = web.Application()
    app.router.add_get("/{tail:.*}", broken)
    server = await aiohttp_server(app, host="127.0.0.1")
    child = await make_node(data_dir=tmp_path / "child", parent=f"http://127.0.0.1:{server.port}")

    with capture_logs() as logs:
        status, headers, body = await child.get(session, "/data.bin")
    assert (status, body, headers["X-Nezha-Cache"]) == (200, BODY, "miss")
    assert asked == [HOST]  # the parent was asked for the origin's name
    assert origin.requests["/data.bin"] == 1
    assert sample(child, "nezha_parent_fallbacks_total", reason="5xx") == 1
    assert [e["reason"] for e in logs if e["event"] == "parent_fallback"] == ["5xx"]


async def test_the_origins_own_5xx_passed_on_by_the_parent_is_not_asked_twice(make_node, origin, session, tmp_path):
    origin.put("/busy.bin", b"try later\n", status=503)
    parent = await make_node(data_dir=tmp_path / "parent")
    child = await make_node(data_dir=tmp_path / "child", parent=parent.url)

    status, headers, body = await child.get(session, "/busy.bin")
    assert (status, body) == (503, b"try later\n")
    assert origin.requests["/busy.bin"] == 1
    assert sample(child, "nezha_parent_fallbacks_total", reason="5xx") == 0


async def test_a_parent_with_its_own_parent_sends_a_childs_request_to_the_origin(make_node, origin, session,
                                                                                 tmp_path):
    """The marker: one hop between tiers, so a chain of parents never loops."""
    origin.put("/data.bin", BODY)
    grandparent = await make_node(data_dir=tmp_path / "grandparent")
    parent = await make_node(data_dir=tmp_path / "parent", parent=grandparent.url)
    child = await make_node(data_dir=tmp_path / "child", parent=parent.url)

    status, _, body = await child.get(session, "/data.bin")
    assert (status, body) == (200, BODY)
    assert requests_to(parent) == 1
    assert requests_to(grandparent) == 0
    assert origin.requests["/data.bin"] == 1


async def test_a_forged_marker_only_makes_a_node_skip_its_parent(make_node, origin, session, tmp_path):
    origin.put("/data.bin", BODY)
    parent = await make_node(data_dir=tmp_path / "parent")
    child = await make_node(data_dir=tmp_path / "child", parent=parent.url)

    status, _, body = await child.get(session, "/data.bin", headers={"X-Nezha-From-Child": "1"})
    assert (status, body) == (200, BODY)
    assert requests_to(parent) == 0
    assert origin.requests["/data.bin"] == 1
    assert not [n for h in origin.request_headers for n in h if n.lower().startswith("x-nezha-")]


async def test_revalidation_goes_through_the_parent(make_node, origin, session, tmp_path):
    origin.put("/data.bin", BODY, headers={"Cache-Control": "no-cache"})
    parent = await make_node(data_dir=tmp_path / "parent", node_id="parent")
    child = await make_node(data_dir=tmp_path / "child", node_id="child", parent=parent.url)

    assert (await child.get(session, "/data.bin"))[2] == BODY
    await child.node.settled()
    await parent.node.settled()
    status, headers, body = await child.get(session, "/data.bin")
    assert (status, body, headers["X-Nezha-Cache"]) == (200, BODY, "revalidated")
    assert requests_to(parent) == 2
    # The origin saw the parent's conditional request, made for the child's.
    assert origin.requests["/data.bin"] == 2
    conditional = origin.request_headers[1]
    assert conditional["If-None-Match"] == origin.etags["/data.bin"]
    assert conditional["Via"] == "1.1 child, 1.1 parent"


async def test_writes_go_through_the_parent_so_its_copy_is_invalidated_too(make_node, origin, session, tmp_path):
    origin.put("/data.bin", BODY)
    parent = await make_node(data_dir=tmp_path / "parent")
    child = await make_node(data_dir=tmp_path / "child", parent=parent.url)
    assert (await child.get(session, "/data.bin"))[2] == BODY
    await child.node.settled()
    await parent.node.settled()

    async with session.put(child.url + "/data.bin", data=b"new bytes", headers={"Host": HOST}) as r:
        assert r.status == 200
    status, headers, body = await child.get(session, "/data.bin")
    assert (status, body, headers["X-Nezha-Cache"]) == (200, b"new bytes", "miss")
    assert origin.requests["/data.bin"] == 3  # GET, PUT, GET: neither tier kept the old bytes


async def test_bypass_requests_go_to_the_parent_unchanged(make_node, origin, session, tmp_path):
    origin.put("/private.bin", b"mine", headers={"Cache-Control": "private"})
    parent = await make_node(data_dir=tmp_path / "parent")
    child = await make_node(data_dir=tmp_path / "child", parent=parent.url)

    status, headers, body = await child.get(session, "/private.bin", headers={"Authorization": "Bearer abc"})
    assert (status, body, headers["X-Nezha-Cache"]) == (200, b"mine", "bypass")
    assert requests_to(parent) == 1
    assert origin.request_headers[0]["Authorization"] == "Bearer abc"
    assert len(parent.node.store) == 0 and len(child.node.store) == 0
    assert sample(child, "nezha_bytes_from_parent_total") == len(b"mine")
    assert sample(child, "nezha_bytes_from_origin_total") == 0
    assert sample(parent, "nezha_bytes_from_origin_total") == len(b"mine")


async def test_a_large_object_from_the_parent_is_one_stream(make_node, origin, session, tmp_path):
    """The parent cuts the origin's answer into ranges; the child does not cut the parent's."""
    big = os.urandom(17 * 1024 * 1024)  # three 8 MiB slices (cachenode/fill/parallel.py SLICE)
    origin.put("/big.bin", big, headers={"Accept-Ranges": "bytes"})
    parent = await make_node(data_dir=tmp_path / "parent", parallel_fill_threshold=1024 * 1024)
    child = await make_node(data_dir=tmp_path / "child", parent=parent.url, parallel_fill_threshold=1024 * 1024)

    assert (await child.get(session, "/big.bin"))[2] == big
    await until(lambda: requests_to(parent) >= 1)
    assert requests_to(parent) == 1  # one request from the child, no ranges
    assert origin.requests["/big.bin"] > 1  # the parent's own fill went parallel
    assert sample(child, "nezha_bytes_from_parent_total") == len(big)


async def test_a_node_with_a_parent_runs_without_an_index(make_node, origin, session, tmp_path):
    """A sidecar has no Redis: its counters are on /metrics alone."""
    origin.put("/data.bin", BODY)
    parent = await make_node(data_dir=tmp_path / "parent")
    child = await make_node(data_dir=tmp_path / "child", parent=parent.url)
    assert child.node.index is None
    await child.get(session, "/data.bin")
    await child.node.settled()
    await child.get(session, "/data.bin")
    async with session.get(child.url + "/metrics") as r:
        text = await r.text()
    assert 'nezha_requests_total{cache="hit"} 1.0' in text
    assert f"nezha_bytes_from_parent_total {float(len(BODY))}" in text


async def broken_parent(aiohttp_server, origin, path: str, *, after: int, etag: str | None = None):
    """A parent that answers `path` as the origin would, then dies after `after` body bytes (a pod restarted)."""
    body = origin.files[path]

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"ETag": etag or origin.etags[path], "X-Nezha-Cache": "hit",
                                           "Cache-Control": "max-age=3600"})
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[:after])
        await asyncio.sleep(0.05)
        request.transport.close()
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    return await aiohttp_server(app, host="127.0.0.1")


async def test_a_parent_that_breaks_off_mid_body_is_finished_by_the_origin(make_node, origin, session, tmp_path,
                                                                          aiohttp_server):
    origin.put("/data.bin", BODY)
    parent = await broken_parent(aiohttp_server, origin, "/data.bin", after=100_000)
    child = await make_node(data_dir=tmp_path / "child", parent=f"http://127.0.0.1:{parent.port}")

    with capture_logs() as logs:
        status, headers, body = await child.get(session, "/data.bin")
        await child.node.settled()
    assert (status, body) == (200, BODY)
    assert origin.requests["/data.bin"] == 1
    assert origin.request_headers[0]["Range"] == f"bytes=100000-{len(BODY) - 1}"
    assert origin.request_headers[0]["If-Range"] == origin.etags["/data.bin"]
    assert sample(child, "nezha_parent_fallbacks_total", reason="broken") == 1
    assert sample(child, "nezha_bytes_from_parent_total") == 100_000
    assert sample(child, "nezha_bytes_from_origin_total") == len(BODY) - 100_000
    [event] = [e for e in logs if e["event"] == "parent_fallback"]
    assert event["reason"] == "broken" and "after 100000 bytes" in event["error"]
    assert (await child.get(session, "/data.bin"))[1]["X-Nezha-Cache"] == "hit"  # stored whole


async def test_a_parent_that_broke_off_with_another_version_than_the_origins_stores_nothing(
        make_node, origin, session, tmp_path, aiohttp_server):
    origin.put("/data.bin", BODY)
    parent = await broken_parent(aiohttp_server, origin, "/data.bin", after=100_000, etag='"older"')
    child = await make_node(data_dir=tmp_path / "child", parent=f"http://127.0.0.1:{parent.port}")

    with capture_logs() as logs:
        async with session.get(child.url + "/data.bin", headers={"Host": HOST}) as r:
            assert r.status == 200
            try:
                got = await r.read()
            except aiohttp.ClientPayloadError:
                got = None
        await child.node.settled()
    assert got is None  # an error, never a body of two versions that looks complete
    assert len(child.node.store) == 0
    assert any("cannot be joined on" in str(e.get("error", "")) for e in logs)


async def test_a_parent_serves_its_childrens_hits_on_its_fast_path(make_node, origin, session, tmp_path):
    origin.put("/data.bin", BODY)
    parent = await make_node(data_dir=tmp_path / "parent")
    first = await make_node(data_dir=tmp_path / "first", parent=parent.url)
    second = await make_node(data_dir=tmp_path / "second", parent=parent.url)
    assert (await first.get(session, "/data.bin"))[2] == BODY
    await parent.node.settled()

    with capture_logs() as logs:
        status, _, body = await second.get(session, "/data.bin")
        await until(lambda: sum(e["event"] == "request_completed" for e in logs) >= 2)
    assert (status, body) == (200, BODY)
    [at_parent] = [e for e in logs if e["event"] == "request_completed" and e.get("fast")]
    assert at_parent["cache"] == "hit"


async def test_a_sidecar_on_loopback_answers_probes_and_scrapes_on_its_admin_port_and_nothing_else(
        node_process, origin, session):
    """The kubelet probes, and Prometheus scrapes, the pod's IP: the data port on 127.0.0.1 is out of their reach."""
    origin.put("/data.bin", BODY)
    admin = free_port()
    node = node_process(origin.url, args=("--parent", f"http://127.0.0.1:{free_port()}",
                                          "--admin-listen", f"127.0.0.1:{admin}"))
    await node.ready(session)
    async with session.get(f"http://127.0.0.1:{admin}/readyz") as r:
        assert r.status == 200 and (await r.json())["ready"] is True
    async with session.get(f"http://127.0.0.1:{node.port}/data.bin", headers={"Host": HOST}) as r:
        assert await r.read() == BODY
    async with session.get(f"http://127.0.0.1:{admin}/metrics") as r:
        assert r.status == 200
        assert 'nezha_parent_fallbacks_total{reason="unreachable"} 1.0' in await r.text()
    async with session.get(f"http://127.0.0.1:{admin}/data.bin", headers={"Host": HOST}) as r:
        assert r.status == 404  # never an object, whatever the Host
    assert origin.requests["/data.bin"] == 1
