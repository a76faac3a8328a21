"""Fault injection with real `nezha cache` processes: a byte flipped in a
stored large object's data file, and a peer that sends a corrupted replica
(issue 37 items 2 and 3, "Tests that must exist").

A large object carries the node's own CRC32C per 1 MiB block. With
--verify-reads a flipped byte is never served: the read finds it, removes
the object, counts it and fetches the object again. Without it, the scrub
finds it. A replica copied from a peer whose disk flipped a byte is refused
by the receiver, which computes its own checksums before it commits; a
source that verifies its reads never sends it at all."""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp

from tests.integration.cachenode.conftest import HOST, flip_byte

MiB = 1 << 20
GOOD = bytes(range(251)) * (3 * MiB // 251 + 1)  # ~3 MiB: 4 blocks, a large object (not sealed small)
PATH = "/data/shard.bin"


async def get(node, session, path: str = PATH, **headers) -> tuple[int, bytes, str | None]:
    async with session.get(f"http://127.0.0.1:{node.port}{path}", headers={"Host": HOST, **headers}) as r:
        return r.status, await r.read(), r.headers.get("X-Nezha-Cache")


async def corrupt_count(node, session, found_by: str) -> float:
    async with session.get(f"http://127.0.0.1:{node.port}/metrics") as r:
        text = await r.text()
    m = re.search(r'^nezha_corrupt_objects_total\{found_by="%s"\} (\S+)$' % found_by, text, re.M)
    assert m is not None, f"no nezha_corrupt_objects_total{{found_by={found_by!r}}}"
    return float(m.group(1))


async def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def data_file(node):
    [path] = [p for p in node.data_dir.rglob("*.data")]
    return path


def meta_of(node) -> dict:
    [path] = list(node.data_dir.rglob("*.meta"))
    return json.loads(path.read_text())



async def stored(node, session) -> None:
    """The object is a hit on `node` (its fill committed)."""
    async def hit() -> bool:
        return (await get(node, session))[2] == "hit"
    await wait_for(hit, "the object never became a hit")


def events(node, name: str) -> list[dict]:
    return [e for e in node.events() if e["event"] == name]


async def test_with_verify_reads_a_flipped_byte_is_never_served_but_removed_counted_and_refetched(
        origin, node_process):
    origin.put(PATH, GOOD)
    node = node_process(origin.url, args=("--verify-reads", "--scrub-interval", "0"))
    async with aiohttp.ClientSession() as session:
        await node.ready(session)
        assert (await get(node, session))[:2] == (200, GOOD)
        await stored(node, session)
        blocks = meta_of(node)["blocks"]
        assert blocks.startswith(f"crc32c/{MiB}/") and len(blocks.split("/")[2]) == 8 * 4

        flip_byte(data_file(node), 2 * MiB + 5)  # in the third block
        # A range in another block is checked by its own block only: intact, served from disk.
        status, body, cache = await get(node, session, Range="bytes=0-99")
        assert (status, body, cache) == (206, GOOD[:100], "hit")
        assert await corrupt_count(node, session, "read") == 0

        status, body, cache = await get(node, session)
        assert status == 200 and body == GOOD and cache == "miss", "a corrupt object was served"
        assert await corrupt_count(node, session, "read") == 1
        [event] = events(node, "object_damaged")
        assert event["found_by"] == "read" and "block 2 " in event["why"], event
        assert origin.requests[PATH] == 2
        await stored(node, session)
        assert data_file(node).read_bytes() == GOOD


async def test_without_verify_reads_a_scrub_at_a_short_interval_finds_a_flipped_byte(origin, node_process):
    origin.put(PATH, GOOD)
    node = node_process(origin.url, args=("--scrub-interval", "0.5"))  # --verify-reads off: the default
    async with aiohttp.ClientSession() as session:
        await node.ready(session)
        assert (await get(node, session))[:2] == (200, GOOD)
        await stored(node, session)
        await asyncio.sleep(1.2)  # at least one pass over the intact object
        assert await corrupt_count(node, session, "scrub") == 0

        flip_byte(data_file(node), MiB + 1)

        async def found() -> bool:
            return await corrupt_count(node, session, "scrub") == 1
        await wait_for(found, "the scrub did not find the flipped byte")
        [event] = events(node, "object_damaged")
        assert event["found_by"] == "scrub" and "block 1 " in event["why"], event
        assert not list(node.data_dir.rglob("*.data")), "the corrupt object was left on disk"
        assert await get(node, session) == (200, GOOD, "miss")
        assert origin.requests[PATH] == 2


async def replicate(session, copier, source, *, source_id: str = "a") -> dict:
    async with session.post(f"http://127.0.0.1:{copier.port}/_nezha/replicate",
                            json={"host": HOST, "path": PATH, "source": source_id,
                                  "address": f"127.0.0.1:{source.port}"}) as r:
        assert r.status == 200, await r.text()
        return json.loads((await r.text()).splitlines()[-1])


async def source_and_copier(origin, node_process, tmp_path, *source_args: str):
    """Two nodes on one origin, the source holding PATH (a hit), the copier nothing."""
    origin.put(PATH, GOOD)
    source = node_process(origin.url, args=(*source_args, "--scrub-interval", "0", "--node-id", "a"))
    copier = node_process(origin.url, args=("--scrub-interval", "0", "--node-id", "b",
                                            "--data-dir", str(tmp_path / "copier")))
    copier.data_dir = tmp_path / "copier"
    async with aiohttp.ClientSession() as session:
        await source.ready(session)
        await copier.ready(session)
        assert (await get(source, session))[:2] == (200, GOOD)
        await stored(source, session)
    return source, copier


async def test_a_replica_copied_from_a_peer_carries_its_block_checksums_and_a_corrupted_one_is_refused(
        origin, node_process, tmp_path):
    source, copier = await source_and_copier(origin, node_process, tmp_path)  # the source does not verify reads
    async with aiohttp.ClientSession() as session:

        # The source's disk flipped a byte, and it does not check its reads: it sends the wrong bytes.
        flip_byte(data_file(source), 3 * MiB - 10)
        result = await replicate(session, copier, source)
        assert result["result"].startswith("failed"), result
        assert not list(copier.data_dir.rglob("*.data")) and not list(copier.data_dir.rglob("*.meta"))
        assert list((copier.data_dir / "tmp").iterdir()) == []
        assert await corrupt_count(copier, session, "copy") == 1
        [event] = events(copier, "corrupt_copy")
        assert "not stored" in event["error"], event

        # Intact again: copied, with the same checksum, computed by the copier from the bytes it got.
        flip_byte(data_file(source), 3 * MiB - 10)
        assert (await replicate(session, copier, source))["result"] == "copied"
        assert meta_of(copier)["blocks"] == meta_of(source)["blocks"]
        assert (await get(copier, session)) == (200, GOOD, "hit")
        assert await corrupt_count(copier, session, "copy") == 1
        assert origin.requests[PATH] == 1, "a copy went to the origin"


async def test_a_source_that_verifies_its_reads_never_sends_a_corrupt_object_to_a_peer(origin, node_process, tmp_path):
    source, copier = await source_and_copier(origin, node_process, tmp_path, "--verify-reads")
    async with aiohttp.ClientSession() as session:
        flip_byte(data_file(source), 10)
        result = await replicate(session, copier, source)
        assert await corrupt_count(source, session, "read") == 1, "the source did not find its corrupt object"
        [event] = events(source, "object_damaged")
        assert event["found_by"] == "read" and "block 0 " in event["why"], event
        # The source read it as gone and fetched it again: the copy got the origin's bytes, never the corrupt ones.
        assert result["result"] == "copied" and origin.requests[PATH] == 2, result
        assert data_file(copier).read_bytes() == GOOD and data_file(source).read_bytes() == GOOD
        assert await corrupt_count(copier, session, "copy") == 0
