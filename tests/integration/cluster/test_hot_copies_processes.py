"""Hot copies in a real cluster: four node processes (R = 2), a real redis-server, a local origin.

64 clients read one 64 MiB object through every node (as a Service spreads a Job's pods): it is fetched from
the origin once, and once hot, every node serves it from its own disk, so the owners' disks carry half
the bytes, not all of them. A write through any node reaches every hot copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import aiohttp
import pytest
import redis.asyncio as aioredis

from nezha.config import Origin
from nezha.dev.local_cluster import LocalCluster
from nezha.index.schema import holders as holders_of, key_object
from testkit.ports import free_run
from tests.integration.cluster.conftest import HOST, fetch, running, settle

PATH = "/datasets/cifar-100-python.tar.gz"
BODY = (bytes(range(251)) * (64 * 1024 * 1024 // 251 + 1))[:64 * 1024 * 1024]  # a shifted or short body shows
DIGEST = hashlib.sha256(BODY).hexdigest()
CLIENTS = 64


@pytest.fixture(params=[2], ids=["hot-reads-2"])
async def hot_cluster(request, origin, redis_server, tmp_path):
    cluster = LocalCluster(nodes=4, origins=[Origin(host=HOST, upstream=origin.url)], data_dir=tmp_path / "c",
                           base_port=free_run(4), replicas=2, redis_url=redis_server.url, log_level="info",
                           # One origin GET per fill (no parallel ranges), so "asked once" is one request.
                           node_settings={"hot_reads": request.param, "hot_window": 60, "capacity": "1GiB",
                                          "parallel_fill_threshold": "1GiB"})
    async with running(cluster):
        yield cluster


async def read_round(session: aiohttp.ClientSession, urls: dict[str, str]) -> dict[str, int]:
    """CLIENTS concurrent GETs, round-robin over the nodes; every body exact. Bytes each node's disk
    served, by X-Nezha-Served-By (a relay names the owner; a hot copy names its own node), else the
    node asked."""
    ids = list(urls)

    async def one(i: int) -> tuple[str, int]:
        asked = ids[i % len(ids)]
        digest, size = hashlib.sha256(), 0
        async with session.get(urls[asked] + PATH, headers={"Host": HOST}) as r:
            async for chunk in r.content.iter_chunked(1 << 20):  # streamed: 64 bodies of 64 MiB stay out of memory
                digest.update(chunk)
                size += len(chunk)
            label = r.headers.get("X-Nezha-Cache")
            assert r.status == 200 and size == len(BODY) and digest.hexdigest() == DIGEST, (asked, r.status, label,
                                                                                          size)
            return r.headers.get("X-Nezha-Served-By", asked), size

    served = {nid: 0 for nid in ids}
    for by, n in await asyncio.gather(*(one(i) for i in range(CLIENTS))):
        served[by] += n
    return served


async def until_served_as(session: aiohttp.ClientSession, url: str, label: str, timeout: float = 15.0) -> None:
    """Read through `url` until the answer comes from that node's own disk as `label`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, headers, body = await fetch(session, url, PATH)
        assert hashlib.sha256(body).hexdigest() == DIGEST
        if headers["X-Nezha-Cache"] == label:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never served {PATH} as {label}")


async def owners_and_others(cluster: LocalCluster) -> tuple[list[str], list[str]]:
    owners = (await cluster.index.get_membership()).ring().owners(f"http://{HOST}{PATH}", 2)
    return owners, [nid for nid in cluster.nodes if nid not in owners]


async def test_one_hot_object_read_through_every_node_is_served_from_every_disk(origin, hot_cluster,
                                                                                redis_server):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    urls = {nid: n.url for nid, n in hot_cluster.nodes.items()}
    owners, others = await owners_and_others(hot_cluster)
    async with aiohttp.ClientSession() as session:
        await read_round(session, urls)  # cold: every body exact, one origin fetch
        await settle(hot_cluster)
        for nid in owners:
            await until_served_as(session, urls[nid], "hit")  # the replica's copy landed
        for nid in others:
            await until_served_as(session, urls[nid], "hot-hit")
        warm = await read_round(session, urls)
    assert origin.requests[PATH] == 1, "one origin fetch for the whole cluster"
    share = {nid: warm[nid] / (CLIENTS * len(BODY)) for nid in urls}
    assert share == {nid: 0.25 for nid in urls}, f"each node's disk serves its own clients: {share}"
    owner_share = sum(share[o] for o in owners)
    assert owner_share == 0.5
    # The index names the owners only: a hot copy is a cache of the cache, nobody's to count as held.
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        holders: set[str] = set()
        for _ in range(100):
            holders = holders_of(await r.hkeys(key_object(f"http://{HOST}{PATH}")))
            if holders == set(owners):
                break
            await asyncio.sleep(0.05)
        assert holders == set(owners)
        await asyncio.sleep(1.5)  # a flush of the nodes' index writes later, still the owners only
        assert holders_of(await r.hkeys(key_object(f"http://{HOST}{PATH}"))) == set(owners)
    finally:
        await r.aclose()


async def test_a_write_reaches_every_hot_copy_and_no_node_serves_the_old_bytes(origin, hot_cluster):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    urls = {nid: n.url for nid, n in hot_cluster.nodes.items()}
    owners, others = await owners_and_others(hot_cluster)
    async with aiohttp.ClientSession() as session:
        await read_round(session, urls)
        for nid in others:
            await until_served_as(session, urls[nid], "hot-hit")
        # Through a node holding a hot copy, so the others (its peer among them) learn it from the broadcast.
        async with session.put(urls[others[0]] + PATH, data=b"new" * 10, headers={"Host": HOST}) as r:
            assert r.status in (200, 201, 204)
        origin.put(PATH, b"new" * 10, headers={"Cache-Control": "max-age=3600"})
        for nid, url in urls.items():
            status, headers, body = await fetch(session, url, PATH)
            assert body == b"new" * 10, (nid, headers.get("X-Nezha-Cache"))
            assert headers["X-Nezha-Cache"] != "hot-hit"


@pytest.mark.parametrize("hot_cluster", [0], ids=["hot-reads-0"], indirect=True)
async def test_with_hot_reads_zero_the_owners_disks_serve_every_byte(origin, hot_cluster):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    urls = {nid: n.url for nid, n in hot_cluster.nodes.items()}
    owners, others = await owners_and_others(hot_cluster)
    async with aiohttp.ClientSession() as session:
        await read_round(session, urls)
        await settle(hot_cluster)
        for nid in owners:
            await until_served_as(session, urls[nid], "hit")
        warm = await read_round(session, urls)  # 16 reads through each node: hot, were copies on
        assert sum(warm[o] for o in owners) == CLIENTS * len(BODY)
        for nid in others:
            assert (await fetch(session, urls[nid], PATH))[1]["X-Nezha-Cache"] == "peer-hit"
    assert origin.requests[PATH] == 1


async def test_an_object_replaced_at_the_origin_reaches_no_reader_once_the_owner_revalidates(origin, hot_cluster):
    """No write tells anyone: the hot copies expire with their owner's copy (3 s), and each is revalidated
    against its owner, never the origin, so every node serves the new bytes and none the old."""
    path = "/datasets/replaced.bin"
    old, new = b"old!" * 250_000, b"new!" * 250_000
    origin.put(path, old, headers={"Cache-Control": "max-age=3"})
    urls = {nid: n.url for nid, n in hot_cluster.nodes.items()}
    owners = (await hot_cluster.index.get_membership()).ring().owners(f"http://{HOST}{path}", 2)
    others = [nid for nid in urls if nid not in owners]
    started = time.time()
    async with aiohttp.ClientSession() as session:
        for nid in others:
            for _ in range(40):
                _, headers, body = await fetch(session, urls[nid], path)
                assert body == old
                if headers["X-Nezha-Cache"] == "hot-hit":
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"{nid} never served {path} from a hot copy")
        origin.put(path, new, headers={"Cache-Control": "max-age=3600"})
        await asyncio.sleep(max(0.0, started + 4.5 - time.time()))  # every copy of the old bytes has expired
        for _ in range(3):
            for nid, url in urls.items():
                status, headers, body = await fetch(session, url, path)
                assert status == 200 and body == new, (nid, headers.get("X-Nezha-Cache"))
    vias = {h.get("Via") for h in origin.request_headers}
    assert vias <= {f"1.1 {o}" for o in owners}, f"only owners asked the origin: {vias}"
