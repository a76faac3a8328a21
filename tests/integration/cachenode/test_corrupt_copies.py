"""A peer's copy is checked against the sender's block checksums before it is
committed (issue 37 item 2): a hot copy and a chunk whose bytes changed on
the sender's disk are refused, logged and counted, and never stored (a
chunk is then fetched from the origin, as from any source that fails). A replica's copy is the same path between real processes:
test_corrupt_objects_processes.py.

In-process nodes on 127.0.0.1, each on its own port and disk, sharing one
ring (the `cluster` fixture): the copies cross real HTTP between them."""

from __future__ import annotations

from structlog.testing import capture_logs

from nezha.chunks import Layout, chunk_key
from nezha.keys import parse_target
from nezha.ring import Peer
from tests.integration.cachenode.conftest import HOST, flip_byte, key_of, owner_and_other

MiB = 1 << 20
PATH = "/datasets/hot/shard-0000.tar"
BODY = bytes(range(256)) * (2 * MiB // 256) + b"tail"  # 2 MiB and a bit: three blocks, a large object



def corrupt(node) -> float:
    return node.node.metrics.corrupt_objects.labels(found_by="copy")._value.get()


async def test_a_hot_copy_from_an_owner_whose_disk_changed_a_byte_is_refused(origin, cluster, session):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    nodes, members = await cluster(2, verify_reads=False)  # the owner sends what its disk holds
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    status, _, body = await nodes[owner].get(session, PATH)
    assert status == 200 and body == BODY
    await nodes[owner].node.settled()
    stored = nodes[owner].node.store.lookup(key_of(PATH))
    assert stored.blocks, "a large object is stored with the node's own checksum"
    flip_byte(nodes[owner].node.store.data_path(stored), MiB + 3)

    source = Peer(owner, members.nodes[owner])
    with capture_logs() as logs:
        result = await nodes[reader].node.handoff.copy_from(source, parse_target(PATH, HOST), hot=True)
    assert result.startswith("failed"), result
    assert key_of(PATH) not in nodes[reader].node.store
    assert list(nodes[reader].node.store.tmp.iterdir()) == []
    [event] = [e for e in logs if e["event"] == "corrupt_copy"]
    assert event["key"] == key_of(PATH)
    assert corrupt(nodes[reader]) == 1

    flip_byte(nodes[owner].node.store.data_path(stored), MiB + 3)  # intact again: the same copy is kept
    result = await nodes[reader].node.handoff.copy_from(source, parse_target(PATH, HOST), hot=True)
    copy = nodes[reader].node.store.lookup(key_of(PATH))
    assert result == "copied" and copy.hot and copy.blocks == stored.blocks
    assert corrupt(nodes[reader]) == 1
    assert origin.requests[PATH] == 1


CHUNKED_PATH = "/datasets/coco/val.zip"
SIZE, CHUNK = 8 * MiB, 2 * MiB
CHUNKED_BODY = b"".join(i.to_bytes(4, "big") for i in range(SIZE // 4))


async def test_a_chunk_copied_from_an_owner_whose_disk_changed_a_byte_is_refused(origin, cluster, session):
    origin.put(CHUNKED_PATH, CHUNKED_BODY, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"})
    nodes, members = await cluster(2, chunk_threshold=4 * MiB, chunk_size=CHUNK, verify_reads=False)
    status, _, body = await nodes["n0"].get(session, CHUNKED_PATH)
    assert status == 200 and body == CHUNKED_BODY
    for nd in nodes.values():
        await nd.node.settled()
    key = key_of(CHUNKED_PATH)
    layout = Layout(size=SIZE, chunk_size=CHUNK)
    held = {i: nid for i in range(layout.count) for nid, nd in nodes.items()
            if chunk_key(key, i, CHUNK) in nd.node.store}
    index, holder = next(iter(held.items()))
    other = next(nid for nid in nodes if nid != holder)
    chunk = nodes[holder].node.store.lookup(chunk_key(key, index, CHUNK))
    assert chunk.blocks and chunk_key(key, index, CHUNK) not in nodes[other].node.store
    flip_byte(nodes[holder].node.store.data_path(chunk), 5)

    # The holder leaves: it asks the chunk's owners under a ring without it to copy the chunk from it.
    from nezha.ring import Membership
    without = Membership(members.epoch + 1, {other: members.nodes[other]})
    nodes[other].node.cluster.update(without)
    # In-process nodes listen on port 0: the address a chunk request names as its source is the real one.
    nodes[holder].node.chunk_copies.me = Peer(holder, members.nodes[holder])
    fetched = origin.requests[CHUNKED_PATH]
    with capture_logs() as logs:
        results = await nodes[holder].node.chunk_copies.hand_off(chunk, _View(without))
    [event] = [e for e in logs if e["event"] == "corrupt_copy"]
    assert event["key"] == chunk_key(key, index, CHUNK)
    assert corrupt(nodes[other]) == 1
    # Refused from the peer, the chunk came from the origin instead: the right bytes, never the peer's.
    assert results == ["copied"] and origin.requests[CHUNKED_PATH] == fetched + 1
    copy = nodes[other].node.store.lookup(chunk_key(key, index, CHUNK))
    with open(nodes[other].node.store.data_path(copy), "rb") as f:
        assert f.read() == CHUNKED_BODY[index * CHUNK:(index + 1) * CHUNK]


class _View:
    """A ring to hand off to (cachenode/chunks/peers.py `Members`)."""

    def __init__(self, snapshot) -> None:
        self.snapshot = snapshot

    @property
    def replicas(self) -> int:
        return 1
