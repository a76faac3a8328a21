"""A follower leads a small cold fill itself once the primary grants it the
key (docs/cache-node.md, "Followers leading small cold fills"; cachenode/workers/lead_desk.py).

Before, every cold fill was the primary's: a follower handed each miss over,
and a first epoch of small files ran at what one process's CPU buys. The
primary grants a lead only for an origin whose recent fills were small (a
fill of it seen, and at most one in its last 32 not a small 200, none while
fewer were seen; the first ask for an origin no fill has shown is denied, so
the primary's fill shows it), and only for a key no one fills and nothing is
stored under; a key a follower leads is in flight for the
primary, so a stampede across workers still asks the origin once. An answer
the follower cannot store at once it declines, handing the client over (a
second origin request); a follower's death releases its leads.

Real processes (`nezha cache --workers 2 --follower-leads`), raw keep-alive connections pinned
to a worker (the worker holding each read from /proc), the origin's answer
held where a test needs a request to wait."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from nezha.config import CacheSettings
from testkit.waits import START_GUARD, wait_for
from tests.integration.cachenode.test_workers import HOST, get, serving_pid, workers_node  # noqa: F401  (a fixture)

CACHE = {"Cache-Control": "max-age=3600"}
SMALL_MAX = CacheSettings.model_fields["small_object_max"].default  # the node runs with the default
LEADS = "--follower-leads"  # the feature is opt-in: off, a node does as before (the last test)
WARM = 24  # small fills through the node before a lead is asked for: the origin shown small, whichever worker fills


def small(i: int) -> bytes:
    """A 4-20 KiB body, distinct for each `i` (an ImageNet JPEG's order of size)."""
    return os.urandom(4096 + (i * 2731) % (16 * 1024))


@dataclass
class Conn:
    """A raw keep-alive connection to the node, and the client port that names it in /proc/net/tcp."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    port: int


async def pinned(node, wanted: dict[int, int]) -> dict[int, list[Conn]]:
    """New connections, `wanted[pid]` of them held by each worker `pid`: the kernel spreads them
    (SO_REUSEPORT); those it gave a worker that has enough are closed."""
    got: dict[int, list[Conn]] = {pid: [] for pid in wanted}
    for _ in range(400):
        if all(len(got[pid]) == n for pid, n in wanted.items()):
            return got
        reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
        port = writer.get_extra_info("sockname")[1]
        await wait_for(lambda: serving_pid(node.port, port) is not None, timeout=START_GUARD)
        holder = serving_pid(node.port, port)
        if holder in got and len(got[holder]) < wanted[holder]:
            got[holder].append(Conn(reader, writer, port))
        else:
            writer.close()
    raise AssertionError(f"the kernel never gave the workers {wanted} connections: {got}")


def send(conn: Conn, path: str) -> None:
    conn.writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())


async def answer(conn: Conn) -> tuple[dict[str, str], bytes]:
    """The answer to the request `send` wrote on `conn`: its fields (names in lower case) and its body.
    The deadline only stops a hang."""
    head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), START_GUARD)
    status, *lines = head.decode("latin-1").split("\r\n")
    fields = {"status": status.split()[1]}
    for line in filter(None, lines):
        name, value = line.split(":", 1)
        fields[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(conn.reader.readexactly(int(fields["content-length"])), START_GUARD)
    return fields, body


async def ask(conn: Conn, path: str) -> tuple[dict[str, str], bytes]:
    send(conn, path)
    return await answer(conn)


def read_by_the_node(server_port: int, conn: Conn) -> bool:
    """Whether the node has read what was written on `conn`: its side's receive queue in
    /proc/net/tcp is empty (the request is no longer the kernel's but a worker's)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(f":{server_port:04X}") and f[2].endswith(f":{conn.port:04X}"):
            return int(f[4].split(":")[1], 16) == 0
    return False


async def leads(session: aiohttp.ClientSession, node, outcome: str) -> float:
    """The primary's count of followers' leads that ended in `outcome` (every outcome's series is there
    from the start, at 0)."""
    return await node.metric(session, f'nezha_worker_leads_total{{outcome="{outcome}"}}')


async def until_counted(session: aiohttp.ClientSession, node, outcome: str, at_least: int) -> None:
    """Until the primary has counted `at_least` leads ending in `outcome`: a follower's outcome reaches it
    over their link a moment after the follower's client has its answer. The deadline only stops a hang."""
    async def enough() -> bool:
        return await leads(session, node, outcome) >= at_least

    try:
        await wait_for(enough, timeout=START_GUARD)
    except AssertionError:
        counts = {o: await leads(session, node, o) for o in ("denied", "stored", "declined", "refused", "lost")}
        raise AssertionError(f"{outcome} leads never reached {at_least}: {counts}") from None


async def warmed(session: aiohttp.ClientSession, node, origin, count: int = WARM) -> None:
    """`count` small objects filled through the node, each on a connection of its own (either worker may
    take it): the fills the primary's gate counts for the origin."""
    for i in range(count):
        path, body = f"/warm/{i}.jpg", small(i)
        origin.put(path, body, headers=CACHE)
        status, got, _ = await get(session, node, path)
        assert (status, got) == (200, body)
    # A follower that led one logs its fill_completed, and the primary admits its record, a moment after
    # its client has the answer: every count of the warm fills is final once the primary stores them all.
    async def all_stored() -> bool:
        return await node.metric(session, "nezha_stored_objects") == count

    await wait_for(all_stored, timeout=START_GUARD)
    await wait_for(lambda: len(node.events("fill_completed")) >= count, timeout=START_GUARD)
    assert len(node.events("fill_completed")) == count


async def warm_node(workers_node, origin, session: aiohttp.ClientSession):
    """A node with follower leads, serving, its origin shown small (`warmed`)."""
    node = workers_node(LEADS)
    await node.wait_serving()
    await warmed(session, node, origin)
    return node


async def handed_over(node, follower: int, path: str, body: bytes) -> None:
    """`path` asked on a connection the kernel gave `follower`: answered whole as a miss, by the primary,
    which holds the connection afterwards."""
    [conn] = (await pinned(node, {follower: 1}))[follower]
    try:
        fields, got = await ask(conn, path)
        assert (fields["status"], fields["x-nezha-cache"], got) == ("200", "miss", body)
        assert serving_pid(node.port, conn.port) == node.pid(0), "a miss not led hands the connection over"
    finally:
        close(conn)


def close(*conns: Conn) -> None:
    for conn in conns:
        conn.writer.close()


async def test_a_follower_fills_small_cold_objects_itself_once_the_origin_proved_small(workers_node, origin, session):
    node = await warm_node(workers_node, origin, session)
    follower = node.pid(1)
    stored = await leads(session, node, "stored")  # warm fills the follower led once the gate opened
    fresh = {f"/train/{i}.jpg": small(100 + i) for i in range(8)}
    for path, body in fresh.items():
        origin.put(path, body, headers=CACHE)
    conns = (await pinned(node, {follower: 4}))[follower]
    try:
        paths = iter(fresh.items())
        for conn in conns:
            for path, body in (next(paths), next(paths)):  # two on each connection, kept alive
                fields, got = await ask(conn, path)
                assert (fields["status"], fields["x-nezha-cache"], got) == ("200", "miss", body), path
                assert serving_pid(node.port, conn.port) == follower, f"{path}: the connection left the follower"
    finally:
        close(*conns)
    await until_counted(session, node, "stored", stored + len(fresh))

    def followers_fills() -> bool:
        filled = {e["path"] for e in node.events("request_completed")
                  if e.get("worker") == 1 and e.get("cache") == "miss" and e.get("fast")}
        led = {e["key"].removeprefix(f"http://{HOST}") for e in node.events("fill_completed")
               if e.get("worker") == 1 and e.get("at_once") is True and e.get("lead") is True}
        return set(fresh) <= filled and set(fresh) <= led

    await wait_for(followers_fills, timeout=START_GUARD)
    for path, body in fresh.items():
        assert await get(session, node, path) == (200, body, "hit"), path
    assert {path: origin.requests[path] for path in fresh} == {path: 1 for path in fresh}


async def test_before_a_fill_showed_the_origins_sizes_a_followers_miss_is_handed_to_the_primary(
        workers_node, origin, session):
    """An origin no fill has shown yet is probed: the first ask is denied, and the primary's fill shows
    whether its objects are small."""
    node = workers_node(LEADS)
    await node.wait_serving()
    follower = node.pid(1)
    path, body = "/train/cold.jpg", small(7)
    origin.put(path, body, headers=CACHE)
    await handed_over(node, follower, path, body)
    await until_counted(session, node, "denied", 1)
    assert await leads(session, node, "stored") == 0
    assert origin.requests[path] == 1
    assert not [e for e in node.events("fill_completed") if e.get("worker") == 1 or e.get("lead")]


async def test_an_origin_that_sent_a_large_object_among_its_first_fills_grants_no_lead(
        workers_node, origin, session):
    """A lead of a large object is declined and the object asked of the origin twice: one large fill among
    an origin's last 32 stops its grants."""
    # The primary's own fills through the engine: a --small-gets primary asks a large answer after small
    # ones twice too, by design (tests/integration/cachenode/test_small_gets_led.py), and this counts asks.
    node = workers_node(LEADS, "--no-small-gets")
    await node.wait_serving()
    await warmed(session, node, origin, count=4)
    primary, follower = node.pid(0), node.pid(1)
    large = "/train/large.bin"
    origin.put(large, os.urandom(4 * SMALL_MAX), headers=CACHE)
    path, body = "/train/after.jpg", small(9)
    origin.put(path, body, headers=CACHE)
    conns = await pinned(node, {primary: 1, follower: 1})
    [on_primary], [on_follower] = conns[primary], conns[follower]
    try:
        fields, got = await ask(on_primary, large)  # the primary's fill, streamed
        assert (fields["status"], got) == ("200", origin.files[large])
        await wait_for(lambda: any(e.get("key", "").endswith(large) for e in node.events("fill_completed")),
                       timeout=START_GUARD)
        stored, denied = await leads(session, node, "stored"), await leads(session, node, "denied")
        fields, got = await ask(on_follower, path)
        assert (fields["status"], fields["x-nezha-cache"], got) == ("200", "miss", body)
        assert serving_pid(node.port, on_follower.port) == primary, "a miss not led hands the connection over"
    finally:
        close(on_primary, on_follower)
    await until_counted(session, node, "denied", denied + 1)
    assert await leads(session, node, "stored") == stored
    assert origin.requests[path] == 1 and origin.requests[large] == 1


async def test_a_stampede_across_workers_on_a_key_a_follower_leads_asks_the_origin_once(workers_node, origin, session):
    node = await warm_node(workers_node, origin, session)
    primary, follower = node.pid(0), node.pid(1)
    path, body, held = "/train/stampede.jpg", small(11), asyncio.Event()
    origin.put(path, body, headers=CACHE, held=held)
    stored = await leads(session, node, "stored")
    conns = await pinned(node, {follower: 4, primary: 4})
    leader, *others = conns[follower] + conns[primary]
    try:
        send(leader, path)
        await wait_for(lambda: origin.requests[path] == 1, timeout=START_GUARD)
        assert serving_pid(node.port, leader.port) == follower, "the follower's miss was handed over, not led"
        for conn in others:
            send(conn, path)
        # Every other request read by a worker while the origin's answer is held: none can be answered yet.
        await wait_for(lambda: all(read_by_the_node(node.port, conn) for conn in others), timeout=START_GUARD)
        assert origin.requests[path] == 1
        held.set()
        fields, got = await answer(leader)
        assert (fields["status"], fields["x-nezha-cache"], got) == ("200", "miss", body)
        for conn in others:
            fields, got = await answer(conn)
            assert (fields["status"], got) == ("200", body)
            # A joiner of the follower's flight, as a joiner of a fill stored at once is; a hit when a handed
            # connection reached the primary only after the follower's record.
            assert fields["x-nezha-cache"] in ("miss-joined", "hit")
        assert serving_pid(node.port, leader.port) == follower
    finally:
        close(*conns[follower], *conns[primary])
    assert origin.requests[path] == 1
    await until_counted(session, node, "stored", stored + 1)


async def test_a_large_answer_on_a_followers_lead_is_declined_and_the_primary_fills_it(workers_node, origin, session):
    node = await warm_node(workers_node, origin, session)
    follower = node.pid(1)
    path = "/train/large.bin"
    body = os.urandom(4 * SMALL_MAX)
    origin.put(path, body, headers=CACHE)
    await handed_over(node, follower, path, body)
    assert origin.requests[path] == 2, "the follower's request, declined, and the primary's"
    await until_counted(session, node, "declined", 1)


async def test_a_small_answer_whose_record_is_too_large_for_the_link_is_declined_never_left_in_flight(
        workers_node, origin, session):
    """Header fields the store keeps (under 64 KiB) can make a record larger than a link takes. The
    follower declines such a lead before it writes anything; before, its record failed to send, its
    client got a 500, and the key stayed in flight at the primary, every later request for it waiting."""
    node = await warm_node(workers_node, origin, session)
    follower = node.pid(1)
    path, body = "/train/annotated.jpg", small(21)
    # Each field under aiohttp's 8190 bytes; 32,000 characters kept in all, half the store's bound, but
    # JSON writes each one as \u00e9: a record of about 200,000 bytes.
    fields_kept = {f"X-Amz-Meta-Note-{i}": "\u00e9" * 4000 for i in range(8)}
    origin.put(path, body, headers={**CACHE, **fields_kept})
    await handed_over(node, follower, path, body)
    await until_counted(session, node, "declined", 1)
    assert origin.requests[path] == 2, "the follower's request, declined, and the primary's"
    status, got, _ = await get(session, node, path)  # stored by the primary: the key is no flight left open
    assert (status, got) == (200, body)
    assert origin.requests[path] == 2


async def test_a_follower_killed_while_leading_releases_its_lead_to_a_waiting_request(workers_node, origin, session):
    node = await warm_node(workers_node, origin, session)
    primary, follower = node.pid(0), node.pid(1)
    path, body, held = "/train/orphan.jpg", small(13), asyncio.Event()
    origin.put(path, body, headers=CACHE, held=held)
    conns = await pinned(node, {follower: 1, primary: 1})
    [leading], [waiting] = conns[follower], conns[primary]
    try:
        send(leading, path)
        await wait_for(lambda: origin.requests[path] == 1, timeout=START_GUARD)
        assert serving_pid(node.port, leading.port) == follower, "the follower's miss was handed over, not led"
        send(waiting, path)
        await wait_for(lambda: read_by_the_node(node.port, waiting), timeout=START_GUARD)
        os.kill(follower, signal.SIGKILL)
        held.set()
        try:
            fields, got = await answer(waiting)
        except asyncio.TimeoutError:
            raise AssertionError("the request waiting on the dead follower's lead was never answered:\n"
                                 + node.log.read_text()[-4000:]) from None
        assert (fields["status"], got) == ("200", body)
    finally:
        close(leading, waiting)
    assert origin.requests[path] == 2, "the dead follower's request, and the waiting one's once it led"
    await until_counted(session, node, "lost", 1)


async def test_without_the_flag_a_follower_asks_no_lead_and_hands_its_miss_to_the_primary(
        workers_node, origin, session):
    """Follower leads are opt-in (`--follower-leads`): without it every fill is the primary's, as before,
    even for an origin of small objects."""
    node = workers_node()
    await node.wait_serving()
    await warmed(session, node, origin)
    follower = node.pid(1)
    path, body = "/train/unled.jpg", small(17)
    origin.put(path, body, headers=CACHE)
    await handed_over(node, follower, path, body)
    assert origin.requests[path] == 1
    assert not [e for e in node.events("fill_completed") if e.get("worker") == 1 or e.get("lead")]
    handed = {e["path"] for e in node.events("request_completed") if e.get("worker") == 0 and e.get("cache") == "miss"}
    assert path in handed
    for outcome in ("denied", "stored"):
        assert await leads(session, node, outcome) == 0, outcome
