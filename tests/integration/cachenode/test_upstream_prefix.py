"""An origin whose upstream has a path: each request's path (and query) is fetched under it.

`--origin host=http://mirror:port/prefix` serves `/a/b` from
`http://mirror:port/prefix/a/b`; the key, the cache and the client see the
path they asked for (the origin table in helm/nezha/README.md, "upstream").
"""

from __future__ import annotations

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST


async def test_an_upstream_with_a_path_prefix_fetches_each_path_under_it_once(origin, make_node, session):
    origin.put("/mirror/datasets/a.bin", b"a" * 5000)
    origin.put("/mirror/q.bin?v=2", b"query kept")
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url + "/mirror/")])  # a trailing / too
    status, headers, body = await node.get(session, "/datasets/a.bin")
    assert (status, headers["X-Nezha-Cache"], body) == (200, "miss", b"a" * 5000)
    await node.node.settled()
    status, headers, body = await node.get(session, "/datasets/a.bin", headers={"Range": "bytes=10-19"})
    assert (status, headers["X-Nezha-Cache"], body) == (206, "hit", b"a" * 10)
    status, _, body = await node.get(session, "/q.bin?v=2")
    assert (status, body) == (200, b"query kept")
    assert origin.requests == {"/mirror/datasets/a.bin": 1, "/mirror/q.bin?v=2": 1}


async def test_a_path_outside_the_prefix_is_the_origins_404_for_the_prefixed_path(origin, make_node, session):
    origin.put("/datasets/a.bin", b"not under the prefix")
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url + "/mirror")])
    status, _, _ = await node.get(session, "/datasets/a.bin")
    assert status == 404
    assert origin.requests == {"/mirror/datasets/a.bin": 1}
