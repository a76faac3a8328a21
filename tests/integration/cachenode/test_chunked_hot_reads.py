"""Hot copies of a chunked object (docs/capacity.md, "One object, warm, chunks and hot copies").

A chunked object read often through a node that does not own its key is
hot-copied there as a whole object is, but what a peer's copy of a chunked
object holds is its manifest: the node then answers without asking the
manifest's owner, and still reads every chunk from the chunks' owners. No
node keeps a hot copy of a chunk.

In-process nodes on 127.0.0.1 sharing one ring (the `cluster` fixture), R = 1.
"""

from __future__ import annotations

from structlog.testing import capture_logs

from nezha.chunks import chunk_of
from tests.integration.cachenode.conftest import owner_and_other
from tests.integration.cachenode.test_chunks import BODY, CHUNKED, KEY, PATH, SIZE, put, read, settled, sha
from testkit.waits import wait_for_value


def chunks_held(node) -> set[str]:
    return {m.key for m in node.node.store.metas() if (chunk_of(m.key) or ("",))[0] == KEY}


async def test_a_hot_chunked_object_is_copied_as_its_manifest_and_its_chunks_stay_on_their_owners(
        origin, cluster, session):
    put(origin)
    nodes, _ = await cluster(4, hot_reads=3, **CHUNKED)
    (owner,), others = owner_and_other(nodes, PATH)
    reader = nodes[others[0]]
    await read(nodes[owner], session)  # stored: the manifest on `owner`, the chunks on their owners
    await settled(nodes)
    before = chunks_held(reader)
    for _ in range(3):  # --hot-reads relayed reads make the key hot on `reader`
        status, headers, digest, n = await read(reader, session)
        assert (status, n, digest, headers["X-Nezha-Cache"]) == (200, SIZE, sha(BODY), "peer-hit")

    def hot_manifest():
        meta = reader.node.store.lookup(KEY)
        return meta if meta is not None and meta.hot else None

    manifest = await wait_for_value(hot_manifest, timeout=10)
    assert manifest.chunk_size == CHUNKED["chunk_size"] and manifest.length == SIZE and manifest.size == 0
    with capture_logs() as logs:
        status, headers, digest, n = await read(reader, session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    assert headers["X-Nezha-Cache"] == "hot-hit"
    answered = [(e["cache"], e["bytes"]) for e in logs if e.get("event") == "request_completed"
                and e.get("cache") != "chunk"]
    # A relayed read is two lines, the owner's manifest (0 bytes) and the reader's; this is the reader's alone.
    assert answered == [("hot-hit", SIZE)], "the manifest's owner was not asked"
    served = [e for e in logs if e.get("event") == "request_completed" and e.get("cache") == "chunk"]
    assert sum(e["bytes"] for e in served) == SIZE - sum(
        m.size for m in reader.node.store.metas() if (chunk_of(m.key) or ("",))[0] == KEY)
    await settled(nodes)
    assert chunks_held(reader) == before, "no chunk was copied to the reading node"
