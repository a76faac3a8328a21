"""`nezha cache --workers 2`: one node, two processes on one port, one store (issue 26, item 1).

Every test runs the real command in a process of its own with a local origin,
as a pod would. What stays exact across workers: one origin fetch for
concurrent cold clients on both, one capacity, one set of counters; and what
a worker's death does: the supervisor starts it again, the other worker's
clients go on, nothing partial is ever served.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from testkit.ports import free_port
from testkit.waits import START_GUARD, wait_for
from testkit.logs import log_events

HOST = "datasets.example"
ROOT = Path(__file__).resolve().parents[3]
BIG = (bytes(range(251)) * (8 * 1024 * 1024 // 251 + 1))[:8 * 1024 * 1024]  # a shifted body shows


class WorkersNode:
    """`nezha cache --workers N` as a process: its log, its workers' pids, its metrics."""

    def __init__(self, tmp: Path, origin_url: str, *extra: str, workers: int = 2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tmp / "data"
        self.log = tmp / "node.log"
        self.argv = [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{self.port}",
                     "--data-dir", str(self.data), "--origin", f"{HOST}={origin_url}", "--workers", str(workers),
                     *extra]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def events(self, name: str | None = None) -> list[dict]:
        return log_events(self.log, name)

    def pid(self, worker: int) -> int:
        """The pid of `worker`'s latest start."""
        return [e["pid"] for e in self.events("worker_started") if e["worker"] == worker][-1]

    def starts(self, worker: int) -> int:
        return sum(1 for e in self.events("worker_started") if e["worker"] == worker)

    def serving(self, primary_starts: int = 1, follower_starts: int = 1) -> bool:
        """Both workers serve: the primary's node_listening and the follower's
        worker_listening since their latest starts."""
        listening = [e for e in self.events() if e.get("event") in ("node_listening", "worker_listening")]
        return (sum(1 for e in listening if e["event"] == "node_listening") >= primary_starts
                and sum(1 for e in listening if e["event"] == "worker_listening") >= follower_starts)

    async def wait_serving(self, primary_starts: int = 1, follower_starts: int = 1) -> None:
        try:
            await wait_for(lambda: self.serving(primary_starts, follower_starts), timeout=60)
        except AssertionError:
            raise AssertionError("not serving:\n" + self.log.read_text()[-4000:]) from None

    async def metric(self, session: aiohttp.ClientSession, pattern: str) -> float:
        async with session.get(self.url + "/metrics") as r:
            text = await r.text()
        m = re.search("^" + re.escape(pattern) + r" ([0-9.e+]+)$", text, re.M)
        assert m, f"{pattern} not in /metrics"
        return float(m.group(1))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def workers_node(tmp_path, origin):
    made: list[WorkersNode] = []

    def make(*extra: str, workers: int = 2) -> WorkersNode:
        node = WorkersNode(tmp_path / f"node{len(made)}", origin.url, *extra, workers=workers)
        node.data.parent.mkdir(parents=True, exist_ok=True)
        made.append(node)
        node.start()
        return node

    yield make
    for node in made:
        node.stop()


async def get(session: aiohttp.ClientSession, node: WorkersNode, path: str) -> tuple[int, bytes, str]:
    """One GET on a connection of its own (so the kernel may give it to either worker)."""
    async with aiohttp.ClientSession(auto_decompress=False) as own:
        async with own.get(node.url + path, headers={"Host": HOST}) as r:
            return r.status, await r.read(), r.headers.get("X-Nezha-Cache", "")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def serving_pid(server_port: int, client_port: int) -> int | None:
    """The process holding the server side of the loopback connection from
    `client_port`: /proc/net/tcp gives its socket's inode, /proc/*/fd who holds it."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote = f[1], f[2]
        if local.endswith(f":{server_port:04X}") and remote.endswith(f":{client_port:04X}"):
            inode = f[9]
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return int(pid)
        except OSError:
            continue
    return None


async def slow_readers(node: WorkersNode, path: str, n: int) -> list[tuple[aiohttp.ClientSession,
                                                                           aiohttp.ClientResponse, int | None]]:
    """`n` readers of a stored object, each on a connection of its own, each
    having read its first 64 KiB and paused; with the pid of the worker serving it."""
    readers = []
    for _ in range(n):
        s = aiohttp.ClientSession(auto_decompress=False)
        r = await s.get(node.url + path, headers={"Host": HOST})
        await r.content.readexactly(64 * 1024)
        port = r.connection.transport.get_extra_info("sockname")[1]
        readers.append((s, r, serving_pid(node.port, port)))
    return readers


async def read_rest(readers) -> list[tuple[int | None, bool]]:
    """Each reader's worker pid and whether its body came whole."""
    ended = []
    for s, r, pid in readers:
        try:
            rest = await r.content.read()
            whole = len(rest) + 64 * 1024 == len(BIG)
        except aiohttp.ClientError:
            whole = False
        ended.append((pid, whole))
        await s.close()
    return ended


async def until_the_follower_serves(node: WorkersNode, path: str) -> None:
    """Until the follower's copy of the index has `path`, which it hears of a moment after the fill (the store
    commits after the fill's client has its last byte, then tells the follower): until then the follower hands
    every request for it to the primary. One-byte ranged GETs, each on a connection of its own (so some land on
    the follower), until the follower's fast path answers one. How long that takes is the machine's load: the
    deadline only stops a hang (testkit/waits.py)."""
    async def the_follower_served() -> bool:
        async with aiohttp.ClientSession(auto_decompress=False) as own:
            async with own.get(node.url + path, headers={"Host": HOST, "Range": "bytes=0-0"}) as r:
                answer = (r.status, await r.read())
        if answer != (206, BIG[:1]):
            pytest.fail(f"bytes=0-0 of {path} answered {answer[0]} with {len(answer[1])} bytes")
        return any(e.get("worker") == 1 and e.get("fast") and e.get("path") == path
                   for e in node.events("request_completed"))

    try:
        await wait_for(the_follower_served, timeout=START_GUARD)
    except AssertionError:
        raise AssertionError(f"the follower never answered a hit of {path}:\n"
                             + node.log.read_text()[-4000:]) from None


async def test_fifty_cold_clients_on_both_workers_cause_one_origin_fetch(workers_node, origin, session):
    origin.put("/cold.bin", BIG, headers={"Cache-Control": "max-age=3600"}, rate=16 * 1024 * 1024)
    node = workers_node("--fill-streams", "1")
    await node.wait_serving()
    answers = await asyncio.gather(*(get(session, node, "/cold.bin") for _ in range(50)))
    assert all(status == 200 and body == BIG for status, body, _ in answers)
    assert origin.requests["/cold.bin"] == 1
    # Both workers took connections: the follower handed its cold ones to the primary, and not all were its.
    handed = await node.metric(session, "nezha_worker_handovers_total")
    assert 0 < handed < 50, handed


async def test_metrics_count_every_request_once_whichever_worker_served_it(workers_node, origin, session):
    origin.put("/small.bin", BIG[:100_000], headers={"Cache-Control": "max-age=3600"})
    node = workers_node()
    await node.wait_serving()
    for _ in range(40):
        status, body, _ = await get(session, node, "/small.bin")
        assert status == 200 and body == BIG[:100_000]
    # At once: a scrape waits for the followers' hits answered before it.
    assert await node.metric(session, 'nezha_requests_total{cache="miss"}') == 1
    assert await node.metric(session, 'nezha_requests_total{cache="hit"}') == 39
    assert await node.metric(session, 'nezha_bytes_served_by_source_total{source="disk"}') == 39 * 100_000
    served_by = {e.get("worker") for e in node.events("request_completed") if e.get("fast")}
    assert served_by == {0, 1}, f"fast hits served by workers {served_by}: both should have served some"


async def test_ranged_reads_on_both_workers_are_answered_where_they_land_and_counted_once(
        workers_node, origin, session):
    """Multipart downloads read in ranges: a follower answers its own (206 from its fast path), handing no
    connection to the primary, and the primary counts each once, with its bytes."""
    origin.put("/ranged.bin", BIG, headers={"Cache-Control": "max-age=3600"})
    node = workers_node()
    await node.wait_serving()
    assert (await get(session, node, "/ranged.bin"))[1] == BIG  # the fill

    async def ranged(rng: str) -> tuple[int, bytes, int | None]:
        """One ranged GET on a connection of its own: status, body, and the pid of the worker holding the
        connection while the answer comes (the one it landed on, unless that one handed it over); None
        for a body small enough to have come whole with the head."""
        async with aiohttp.ClientSession(auto_decompress=False) as own:
            async with own.get(node.url + "/ranged.bin", headers={"Host": HOST, "Range": rng}) as r:
                conn = r.connection
                pid = None if conn is None else serving_pid(node.port, conn.transport.get_extra_info("sockname")[1])
                return r.status, await r.read(), pid

    await until_the_follower_serves(node, "/ranged.bin")
    # One connection for every scrape: handed over at most once, before the first count is read.
    await node.metric(session, "nezha_worker_handovers_total")
    handed = await node.metric(session, "nezha_worker_handovers_total")
    hits = await node.metric(session, 'nezha_requests_total{cache="hit"}')
    disk = await node.metric(session, 'nezha_bytes_served_by_source_total{source="disk"}')

    size, mib = len(BIG), 1024 * 1024
    spans = [(i * 700_001 % (size - mib), mib) for i in range(30)] + [(size - 12_345, 12_345)] * 5
    asks = [f"bytes={s}-{s + n - 1}" for s, n in spans[:30]] + ["bytes=-12345"] * 3 + [f"bytes={size - 12_345}-"] * 2
    answers = [await ranged(a) for a in asks]
    assert [(status, body) for status, body, _ in answers] == [(206, BIG[s:s + n]) for s, n in spans]
    assert {pid for _, _, pid in answers} - {None} == {node.pid(0), node.pid(1)}, "both should have answered some"

    assert await node.metric(session, "nezha_worker_handovers_total") == handed
    assert await node.metric(session, 'nezha_requests_total{cache="hit"}') == hits + len(asks)
    assert await node.metric(session, 'nezha_bytes_served_by_source_total{source="disk"}') == disk + sum(
        n for _, n in spans)
    # Each worker logs what it served (lines of one kind in a burst are summed up as log_repeated).
    assert {e["worker"] for e in node.events("request_completed") if e.get("status") == 206
            and e["bytes"] > 1 and e.get("fast")} == {0, 1}


async def test_a_follower_killed_mid_fill_is_restarted_and_the_fill_completes_for_every_client(
        workers_node, origin, session):
    origin.put("/slow.bin", BIG, headers={"Cache-Control": "max-age=3600"}, rate=4 * 1024 * 1024)
    node = workers_node("--fill-streams", "1")
    await node.wait_serving()
    follower = node.pid(1)
    clients = [asyncio.ensure_future(get(session, node, "/slow.bin")) for _ in range(10)]
    await wait_for(lambda: origin.requests["/slow.bin"] == 1, timeout=30)
    os.kill(follower, signal.SIGKILL)
    answers = await asyncio.gather(*clients)
    assert all(status == 200 and body == BIG for status, body, _ in answers)
    assert origin.requests["/slow.bin"] == 1
    await wait_for(lambda: node.starts(1) == 2, timeout=30)
    await node.wait_serving(follower_starts=2)
    assert node.pid(1) != follower and alive(node.pid(1))


async def test_the_primary_killed_mid_fill_cuts_only_its_own_clients_and_nothing_partial_is_served(
        workers_node, origin, session):
    origin.put("/hit.bin", BIG, headers={"Cache-Control": "max-age=3600"})
    origin.put("/slow.bin", BIG, headers={"Cache-Control": "max-age=3600"}, rate=2 * 1024 * 1024)
    node = workers_node("--fill-streams", "1")
    await node.wait_serving()
    assert (await get(session, node, "/hit.bin"))[1] == BIG
    await until_the_follower_serves(node, "/hit.bin")
    primary, follower = node.pid(0), node.pid(1)

    # Slow readers of a stored object, on connections of their own; some land on each worker.
    readers = await slow_readers(node, "/hit.bin", 16)
    on_follower = [x for x in readers if x[2] == follower]
    assert on_follower and len(on_follower) < len(readers), [x[2] for x in readers]

    cold = asyncio.ensure_future(get(session, node, "/slow.bin"))
    await wait_for(lambda: origin.requests["/slow.bin"] == 1, timeout=30)
    os.kill(primary, signal.SIGKILL)
    try:
        status, body, _ = await cold
        assert status != 200 or body == BIG, "a body cut short must never look complete"
    except aiohttp.ClientError:
        pass  # cut: the client sees the connection end before Content-Length

    for pid, whole in await read_rest(readers):
        if pid == follower:
            assert whole, "a hit served by the follower must not feel the primary's death"

    await wait_for(lambda: node.starts(0) == 2, timeout=30)
    await node.wait_serving(primary_starts=2, follower_starts=2)
    for _ in range(4):
        status, body, _ = await get(session, node, "/slow.bin")
        assert status == 200 and body == BIG


async def test_eviction_under_reads_on_both_workers_keeps_one_capacity_and_cuts_no_reader(
        workers_node, origin, session):
    size = 1024 * 1024
    for i in range(10):
        origin.put(f"/o{i}.bin", bytes([i]) * size, headers={"Cache-Control": "max-age=3600"})
    node = workers_node("--capacity", "4MiB")
    await node.wait_serving()

    def on_disk() -> int:
        return sum(p.stat().st_size for p in (node.data / "objects").rglob("*.data") if p.exists())

    peak = 0
    for round_ in range(3):
        for i in range(10):
            # Two cold reads of a new object (one fill evicting), beside hits of the last two.
            wanted = (i, i, (i - 1) % 10, (i - 1) % 10, (i - 2) % 10, (i - 2) % 10)
            answers = await asyncio.gather(*(get(session, node, f"/o{j}.bin") for j in wanted))
            for (status, body, _), j in zip(answers, wanted):
                assert status == 200 and body == bytes([j]) * size
            peak = max(peak, on_disk())
    assert peak <= 4 * size, peak
    assert await node.metric(session, "nezha_stored_bytes") <= 4 * size
    assert await node.metric(session, "nezha_evictions_total") > 0
    served_by = {e.get("worker") for e in node.events("request_completed") if e.get("fast")}
    assert served_by == {0, 1}


async def test_sigterm_stops_every_worker_and_a_followers_hits_in_flight_are_finished(
        workers_node, origin, session):
    origin.put("/hit.bin", BIG, headers={"Cache-Control": "max-age=3600"})
    node = workers_node()
    await node.wait_serving()
    assert (await get(session, node, "/hit.bin"))[1] == BIG
    pids = [node.pid(0), node.pid(1)]
    readers = await slow_readers(node, "/hit.bin", 16)
    assert pids[1] in [pid for _, _, pid in readers], "16 connections, none the follower's"
    node.proc.send_signal(signal.SIGTERM)
    for pid, whole in await read_rest(readers):
        if pid == pids[1]:
            assert whole, "a hit the follower is sending is finished, not cut, when it stops"
    assert await asyncio.to_thread(node.proc.wait, 60) == 0
    assert not any(alive(p) for p in pids)
    assert node.events("node_stopping"), "the primary stopped as a lone node does"
    assert len(node.events("worker_stopping")) == 1  # "stopping", or "primary gone" if the primary's exit came first


async def test_a_node_killed_with_sigkill_leaves_no_worker_and_restarts_serving_nothing_partial(
        workers_node, origin, session, tmp_path):
    origin.put("/slow.bin", BIG, headers={"Cache-Control": "max-age=3600"}, rate=4 * 1024 * 1024)
    node = workers_node("--fill-streams", "1")
    await node.wait_serving()
    pids = [node.pid(0), node.pid(1)]
    cold = asyncio.ensure_future(get(session, node, "/slow.bin"))
    await wait_for(lambda: origin.requests["/slow.bin"] == 1, timeout=30)
    node.proc.kill()
    node.proc.wait(10)
    await wait_for(lambda: not any(alive(p) for p in pids), timeout=10)
    try:
        status, body, _ = await cold
        assert status != 200 or body == BIG
    except aiohttp.ClientError:
        pass
    node.start()  # the same data directory
    await node.wait_serving(primary_starts=2, follower_starts=2)
    status, body, label = await get(session, node, "/slow.bin")
    assert status == 200 and body == BIG and label == "miss"
    assert origin.requests["/slow.bin"] == 2


async def test_port_zero_is_chosen_once_and_shared_by_every_worker(tmp_path, origin, session):
    """`--listen HOST:0` means any free port; N workers must share one, so
    the supervisor chooses it and every worker listens there."""
    origin.put("/zero.bin", BIG[:50_000], headers={"Cache-Control": "max-age=3600"})
    node = WorkersNode(tmp_path, origin.url)
    node.argv[node.argv.index("--listen") + 1] = "127.0.0.1:0"
    node.start()
    try:
        await node.wait_serving()
        chosen = node.events("ports_chosen")[0]["listen"]
        assert chosen != "127.0.0.1:0"
        assert [e["listen"] for e in node.events("node_listening")] == [chosen]
        assert [e["listen"] for e in node.events("worker_listening")] == [chosen]
        node.port = int(chosen.rsplit(":", 1)[1])
        node.url = f"http://{chosen}"
        for _ in range(4):
            status, body, _ = await get(session, node, "/zero.bin")
            assert status == 200 and body == BIG[:50_000]
    finally:
        node.stop()



def test_a_taken_port_fails_the_command_with_a_single_process_error(tmp_path, origin):
    import socket

    node = WorkersNode(tmp_path, origin.url)
    with socket.socket() as taken:  # something else listens there, without SO_REUSEPORT
        taken.bind(("127.0.0.1", node.port))
        taken.listen()
        run = subprocess.run(node.argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert f"cannot listen on 127.0.0.1:{node.port} (--listen): address already in use" in run.stderr
    assert "worker_started" not in run.stdout  # refused before any worker was started


async def test_without_the_flag_a_node_runs_a_worker_per_usable_cpu(tmp_path, origin):
    """The default is `auto`, nginx's `worker_processes auto`: the CPUs this
    process may use (its affinity, capped by a cgroup quota)."""
    from cachenode.cli import worker_count

    node = WorkersNode(tmp_path, origin.url)
    at = node.argv.index("--workers")
    del node.argv[at:at + 2]
    node.start()
    try:
        expected = worker_count("auto")
        if expected == 1:
            await wait_for(lambda: node.events("node_listening"), timeout=60)
            assert not node.events("worker_started")  # one process, no supervisor
        else:
            await node.wait_serving()
            await wait_for(lambda: len(node.events("worker_listening")) == expected - 1, timeout=60)
            assert sorted(e["worker"] for e in node.events("worker_started")) == list(range(expected))
    finally:
        node.stop()
