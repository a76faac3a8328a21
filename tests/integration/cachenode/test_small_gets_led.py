"""Cold small misses the fast path leads asked on the node's own connections
(`--small-gets`, cachenode/fill/small_gets.py, front/fast_misses.py): once an
origin's recent fills were small, its next are asked that way and stored
and answered exactly as through the engine's client, counted the same; an
answer that is not a small whole 200 is asked again the usual way and
nothing of it is stored; with the flag off nothing changes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections import Counter as Tally

from tests.integration.cachenode.conftest import HOST, key_of
from tests.integration.cachenode.test_fast_misses import _exchange, _response, field, request

PATHS = [f"/d/{n}.bin" for n in range(6)]
BODIES = {path: os.urandom(16 * 1024 + n) for n, path in enumerate(PATHS)}


class Stats:
    """What the node counts for `nezha stats` (the index's per-origin counters), summed."""

    def __init__(self) -> None:
        self.deltas: Tally[str] = Tally()

    def count(self, host: str, **deltas: int) -> None:
        self.deltas.update({f"{host} {k}": v for k, v in deltas.items()})

    def __getattr__(self, name: str):
        return lambda *a, **k: None


def metric_values(node) -> dict[str, float]:
    """Every counter's and histogram count's value, but the small gets' own and the timings'."""
    out: dict[str, float] = {}
    for line in node.node.metrics.render().decode().splitlines():
        if line.startswith("#") or "small_gets" in line or "_bucket" in line or "_sum" in line:
            continue
        name, _, value = line.rpartition(" ")
        if "_total" in name or name.endswith("_count"):
            out[name] = float(value)
    return out


def small_gets(node, outcome: str) -> float:
    return node.node.metrics.registry.get_sample_value("nezha_small_gets_total", {"outcome": outcome}) or 0.0


async def fill_all(node, paths: list[str]) -> list[tuple[bytes, bytes]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    answers = []
    try:
        for path in paths:
            writer.write(request(path))
            answers.append(await asyncio.wait_for(_response(reader), 10))
    finally:
        writer.close()
    return answers


def stored(node, path: str) -> dict:
    meta = node.node.store.lookup(key_of(path))
    assert meta is not None
    fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)
              if f.name not in ("stored_at", "expires_at", "data", "headers")}
    fields["headers"] = [(k, v) for k, v in meta.headers if k != "Date"]
    return fields


async def run_cold(origin, make_node, tmp_path, *, small_gets_on: bool):
    node = await make_node(data_dir=tmp_path / f"node-{small_gets_on}", small_gets=small_gets_on)
    node.node.counts.index = stats = Stats()
    before = metric_values(node)
    answers = await fill_all(node, PATHS)
    after = metric_values(node)
    deltas = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    return node, answers, deltas, stats.deltas


async def test_cold_small_fills_store_answer_and_count_exactly_as_through_the_engine(origin, make_node, tmp_path):
    for path, body in BODIES.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=3600", "X-Kept": "k"})
    off, off_answers, off_metrics, off_stats = await run_cold(origin, make_node, tmp_path, small_gets_on=False)
    assert small_gets(off, "stored") == small_gets(off, "fallback") == 0
    origin.requests.clear()
    on, on_answers, on_metrics, on_stats = await run_cold(origin, make_node, tmp_path, small_gets_on=True)
    # The first fill of the origin opens the gate; every later one is asked on the node's own connections.
    assert small_gets(on, "stored") == len(PATHS) - 1 and small_gets(on, "fallback") == 0
    assert all(origin.requests[path] == 1 for path in PATHS)
    for (off_head, off_body), (on_head, on_body), path in zip(off_answers, on_answers, PATHS):
        assert off_body == on_body == BODIES[path]
        drop = (b"date:", b"age:")
        assert [line for line in off_head.split(b"\r\n") if not line.lower().startswith(drop)] == [
            line for line in on_head.split(b"\r\n") if not line.lower().startswith(drop)]
        assert field(on_head, "X-Nezha-Cache") == "miss"
        assert stored(off, path) == stored(on, path)
    assert on_metrics == off_metrics
    assert on_stats == off_stats and on_stats[f"{HOST} misses"] == len(PATHS)


async def test_a_large_answer_after_the_gate_opened_is_asked_again_and_served_whole(origin, make_node):
    origin.put("/small.bin", BODIES[PATHS[0]], headers={"Cache-Control": "max-age=3600"})
    large = os.urandom(3 * 1024 * 1024)
    origin.put("/large.bin", large, headers={"Cache-Control": "max-age=3600"})
    node = await make_node(small_gets=True)
    [(head, body)] = await fill_all(node, ["/small.bin"])
    assert body == BODIES[PATHS[0]]
    [(head, body)] = await _exchange(node, request("/large.bin"))
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == large
    assert origin.requests["/large.bin"] == 2  # declined by the small client, asked again through the engine
    assert small_gets(node, "fallback") == 1 and small_gets(node, "stored") == 0
    await node.node.settled()
    meta = node.node.store.lookup(key_of("/large.bin"))
    assert meta is not None and meta.size == len(large)
    [(head, body)] = await _exchange(node, request("/large.bin"))
    assert field(head, "X-Nezha-Cache") == "hit" and body == large


async def test_a_404_after_the_gate_opened_is_passed_on_and_nothing_stored(origin, make_node):
    origin.put("/small.bin", BODIES[PATHS[0]], headers={"Cache-Control": "max-age=3600"})
    node = await make_node(small_gets=True)
    await fill_all(node, ["/small.bin"])
    [(head, body)] = await _exchange(node, request("/missing.bin"))
    assert head.startswith(b"HTTP/1.1 404 ") and body == b"no /missing.bin\n"
    assert small_gets(node, "fallback") == 1
    assert node.node.store.lookup(key_of("/missing.bin")) is None or node.node.store.lookup(
        key_of("/missing.bin")).status == 404


async def test_a_stampede_for_one_key_asks_the_origin_once(origin, make_node):
    origin.put("/small.bin", BODIES[PATHS[0]], headers={"Cache-Control": "max-age=3600"})
    origin.put("/same.bin", BODIES[PATHS[1]], delay=0.3, headers={"Cache-Control": "max-age=3600"})
    node = await make_node(small_gets=True)
    await fill_all(node, ["/small.bin"])
    answers = await asyncio.gather(*(_exchange(node, request("/same.bin")) for _ in range(12)))
    assert all(body == BODIES[PATHS[1]] for [(_, body)] in answers)
    assert origin.requests["/same.bin"] == 1
    assert small_gets(node, "stored") == 1


async def test_without_small_gets_every_fill_goes_through_the_engine(origin, make_node):
    for path, body in BODIES.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=3600"})
    node = await make_node(small_gets=False)
    assert node.node.small_gets is None and node.node.handler.misses.small_gets is None
    answers = await fill_all(node, PATHS)
    assert [body for _, body in answers] == [BODIES[p] for p in PATHS]
    assert small_gets(node, "stored") == small_gets(node, "fallback") == 0


async def test_many_small_misses_at_once_reuse_the_node_s_own_connections(origin, make_node):
    count, clients = 300, 16
    for n in range(count):
        origin.put(f"/img/{n}.jpg", bytes([n % 251]) * (3000 + n), headers={"Cache-Control": "max-age=600"})
    node = await make_node(small_gets=True)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(count):
        queue.put_nowait(n)

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        try:
            while not queue.empty():
                n = queue.get_nowait()
                writer.write(request(f"/img/{n}.jpg"))
                head, got = await asyncio.wait_for(_response(reader), 10)
                assert got == bytes([n % 251]) * (3000 + n) and field(head, "X-Nezha-Cache") == "miss"
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    assert sum(origin.requests.values()) == count
    assert small_gets(node, "stored") >= count - clients and small_gets(node, "fallback") == 0
    # The engine's pool for the fills before the origin was seen small, then at most one of the node's own
    # per fill in flight (and a few closed and reopened meanwhile).
    assert len(origin.connections) <= 2 * clients + 4, len(origin.connections)
    assert node.node.small_gets.opened("127.0.0.1", int(origin.url.rsplit(":", 1)[1])) <= clients


async def test_64_small_misses_at_once_are_all_at_the_origin_and_a_later_wave_reuses_the_node_s_connections(
        origin, make_node):
    """As test_misses_in_flight.py's for the engine's pool: the origin holds each answer until 64 requests
    are in flight, so a node that asked one after another would leave it waiting and fail here."""
    clients = 64
    bodies = {f"/w/{n}.bin": os.urandom(16 * 1024) for n in range(3 * clients)}
    for path, body in bodies.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=3600"})
    full = origin.hold_until_in_flight(clients)
    node = await make_node(small_gets=True)
    paths = list(bodies)

    async def wave(part: list[str]) -> set:
        full.clear()
        origin.most_in_flight = 0
        before = set(origin.connections)
        got = await asyncio.gather(*(_exchange(node, request(p)) for p in part))
        assert [body for [(_, body)] in got] == [bodies[p] for p in part]
        assert origin.most_in_flight == clients, f"at most {origin.most_in_flight} of {clients} at the origin"
        return set(origin.connections) - before

    await wave(paths[:clients])  # through the engine: the origin not seen yet
    second = await wave(paths[clients:2 * clients])  # the node's own connections, one per fill in flight
    assert small_gets(node, "stored") == clients and len(second) == clients
    assert await wave(paths[2 * clients:]) == set(), "the third wave on the second's connections"
    assert small_gets(node, "stored") == 2 * clients and small_gets(node, "fallback") == 0
    assert all(origin.requests[p] == 1 for p in bodies)


async def test_a_full_store_s_refusals_are_streamed_from_memory_never_asked_twice(origin, make_node):
    """A dataset larger than the cache: what the store will not keep goes to its client from the answer in
    hand, as the engine's at-once path streams it, and the origin is asked once per request."""
    size = 4096
    paths = [f"/full/{n}.bin" for n in range(60)]
    bodies = {p: os.urandom(size) for p in paths}
    for path, body in bodies.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=3600"})
    node = await make_node(small_gets=True, capacity=20 * size, hot_reads=0)
    answers = await fill_all(node, paths)
    assert [body for _, body in answers] == [bodies[p] for p in paths]
    assert all(origin.requests[p] == 1 for p in paths)
    assert small_gets(node, "fallback") == 0 and small_gets(node, "stored") == len(paths) - 1
    await node.node.settled()
    assert sum(node.node.store.lookup(key_of(p)) is not None for p in paths) < len(paths)  # some refused
