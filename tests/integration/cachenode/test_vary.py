"""Responses with Vary are stored per variant and never given to a request that selects another (RFC 9111 §4.1)."""

from __future__ import annotations

import asyncio
import gzip
import os

import pytest
from aiohttp import web

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST

PATH = "/datasets/train.jsonl"
KEY = f"http://{HOST}{PATH}"
PLAIN = b"".join(b'{"text": "%s"}\n' % os.urandom(32).hex().encode() for _ in range(500))
GZIPPED = gzip.compress(PLAIN, mtime=0)


class NegotiatingOrigin:
    """Serves gzip to clients that accept it, identity to the others, with `Vary: Accept-Encoding`."""

    def __init__(self, *, vary: str = "Accept-Encoding", delay: float = 0.0, hold: bool = False) -> None:
        self.vary = vary
        self.delay = delay
        # With `hold`, a gzip body stops after its first part until `release` is set;
        # `midway` says it got there.
        self.hold = hold
        self.midway = asyncio.Event()
        self.release = asyncio.Event()
        self.requests: list[str | None] = []  # each request's Accept-Encoding
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            await request.read()
            return web.Response(status=204)
        accept = request.headers.get("Accept-Encoding")
        self.requests.append(accept)
        if self.delay:
            await asyncio.sleep(self.delay)
        zipped = accept is not None and "gzip" in accept
        headers = {"Vary": self.vary, "Cache-Control": "max-age=3600", "Content-Type": "application/jsonl",
                   "ETag": '"gz"' if zipped else '"id"'}
        if zipped:
            headers["Content-Encoding"] = "gzip"
        resp = web.StreamResponse(headers=headers)
        body = GZIPPED if zipped else PLAIN
        resp.content_length = len(body)
        await resp.prepare(request)
        # Two writes with a pause: a request arriving meanwhile meets the fill streaming.
        await resp.write(body[:100])
        if self.hold and zipped:
            self.midway.set()
            await self.release.wait()
        else:
            await asyncio.sleep(self.delay)
        await resp.write(body[100:])
        await resp.write_eof()
        return resp


@pytest.fixture
async def negotiating(aiohttp_server):
    async def start(**kwargs) -> NegotiatingOrigin:
        o = NegotiatingOrigin(**kwargs)
        server = await aiohttp_server(o.app(), host="127.0.0.1")
        o.url = f"http://127.0.0.1:{server.port}"
        return o

    return start


def encoding(accept: str | None) -> dict[str, str]:
    return {"Accept-Encoding": accept} if accept is not None else {}


@pytest.mark.parametrize("fast_hits", [True, False], ids=["fast-path", "aiohttp"])
async def test_two_clients_differing_in_accept_encoding_each_get_their_own_stored_variant(
        negotiating, make_node, session, fast_hits):
    origin = await negotiating()
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url)], fast_hits=fast_hits)
    for accept, body, label in (("gzip", GZIPPED, "miss"), ("identity", PLAIN, "miss"),
                                ("gzip", GZIPPED, "hit"), ("identity", PLAIN, "hit"),
                                ("GZIP", GZIPPED, "hit")):  # codings are case-insensitive
        status, headers, got = await node.get(session, PATH, headers=encoding(accept))
        assert status == 200 and got == body and headers["X-Nezha-Cache"] == label, (accept, label)
        assert headers["Vary"] == "Accept-Encoding"
        await node.node.settled()
    assert origin.requests == ["gzip", "identity"]
    assert len(node.node.store.metas()) == 2 and KEY in node.node.store
    # A client that asks for another coding is a third variant, not either of these.
    status, headers, got = await node.get(session, PATH, headers=encoding("br"))
    assert got == PLAIN and headers["X-Nezha-Cache"] == "miss"


async def test_variants_survive_a_restart(negotiating, make_node, session, tmp_path):
    origin = await negotiating()
    origins = [Origin(host=HOST, upstream=origin.url)]
    node = await make_node(origins=origins, data_dir=tmp_path / "d")
    for accept in ("gzip", "identity"):
        await node.get(session, PATH, headers=encoding(accept))
    await node.node.settled()
    await node.server.close()
    again = await make_node(origins=origins, data_dir=tmp_path / "d")
    # Once the background load is done the index alone answers (before, a variant
    # is found by hashed path: tests/integration/cachenode/test_vary_while_loading.py).
    await again.node.store.loaded()
    for accept, body in (("gzip", GZIPPED), ("identity", PLAIN)):
        _, headers, got = await again.get(session, PATH, headers=encoding(accept))
        assert got == body and headers["X-Nezha-Cache"] == "hit"
    assert len(origin.requests) == 2


async def test_vary_star_is_never_reused(negotiating, make_node, session):
    origin = await negotiating(vary="*")
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url)])
    for _ in range(2):
        _, headers, _ = await node.get(session, PATH, headers=encoding("gzip"))
        assert headers["X-Nezha-Cache"] == "pass"
        await node.node.settled()
    assert len(origin.requests) == 2 and len(node.node.store) == 0


async def test_a_request_selecting_another_variant_never_joins_the_fill(negotiating, make_node, session):
    """The identity client arrives while the gzip body streams: it gets its own answer, not gzip."""
    origin = await negotiating(hold=True)
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url)])
    zipped = asyncio.get_running_loop().create_task(node.get(session, PATH, headers=encoding("gzip")))
    await asyncio.wait_for(origin.midway.wait(), 30)  # headers in, body half-way, held there
    async with session.get(node.url + PATH, headers={"Host": HOST, **encoding("gzip")},
                           auto_decompress=False) as twin:
        # Its head arrives while the origin holds the body: it joined the fill (nothing is stored yet).
        assert twin.headers["X-Nezha-Cache"] == "miss-joined"
        _, plain_headers, plain = await node.get(session, PATH, headers=encoding("identity"))
        origin.release.set()
        twin_body = await twin.read()
    _, zip_headers, zipped_body = await zipped
    assert zipped_body == twin_body == GZIPPED
    assert plain == PLAIN and "Content-Encoding" not in plain_headers and plain_headers["X-Nezha-Cache"] == "pass"


async def test_a_write_invalidates_every_variant(negotiating, make_node, session):
    origin = await negotiating()
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url)])
    for accept in ("gzip", "identity"):
        await node.get(session, PATH, headers=encoding(accept))
    await node.node.settled()
    async with session.delete(node.url + PATH, headers={"Host": HOST}) as r:
        assert r.status == 204
    assert KEY not in node.node.store and node.node.store.metas() == []


async def test_a_cluster_keeps_each_variant_on_the_keys_owners(negotiating, cluster, session):
    from tests.integration.cachenode.conftest import owner_and_other, until

    origin = await negotiating()
    nodes, _ = await cluster(3, replicas=2, origins=[Origin(host=HOST, upstream=origin.url)])
    owners, others = owner_and_other(nodes, PATH, replicas=2)
    entry = nodes[others[0]]
    for accept, body in (("gzip", GZIPPED), ("identity", PLAIN)):
        _, headers, got = await entry.get(session, PATH, headers=encoding(accept))
        assert got == body and headers["X-Nezha-Cache"] == "peer-miss"
    # The first owner filled both variants and pushed each to the second owner.
    await until(lambda: all(len(nodes[o].node.store.metas()) == 2 for o in owners))
    assert len(entry.node.store.metas()) == 0
    for accept, body in (("gzip", GZIPPED), ("identity", PLAIN)):
        _, headers, got = await entry.get(session, PATH, headers=encoding(accept))
        assert got == body and headers["X-Nezha-Cache"] == "peer-hit"
        _, headers, got = await nodes[owners[1]].get(session, PATH, headers=encoding(accept))
        assert got == body and headers["X-Nezha-Cache"] == "hit"
    assert origin.requests == ["gzip", "identity"]
