"""`nezha up`: a local cluster from one command, stopped cleanly by SIGTERM."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys

import aiohttp

from testkit.ports import free_run
from tests.support_origin import TestOrigin


async def test_up_starts_nodes_prints_them_and_stops_on_sigterm(aiohttp_server, tmp_path):
    origin = TestOrigin()
    origin.put("/f.bin", b"f" * 50_000)
    server = await aiohttp_server(origin.app(), host="127.0.0.1")
    base = free_run(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "up", "--nodes", "2", "--base-port", str(base),
         "--data-dir", str(tmp_path), "--origin", f"www.cs.toronto.edu=http://127.0.0.1:{server.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        loop = asyncio.get_running_loop()
        lines = []
        while len([x for x in lines if x.startswith("node-")]) < 2:
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 30)
            assert line, f"nezha up exited early with {proc.poll()}"
            lines.append(line.strip())
        assert "replicas-per-key 2" in lines  # the default for two or more nodes
        nodes = [x.split() for x in lines if x.startswith("node-")]
        assert [n[0] for n in nodes] == ["node-0", "node-1"]
        assert [n[1] for n in nodes] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
        pids = [int(n[2].removeprefix("pid=")) for n in nodes]
        async with aiohttp.ClientSession() as s:
            for _, address, _ in nodes:
                async with s.get(f"http://{address}/readyz") as r:
                    assert (await r.json())["replicas"] == 2
            for _, address, _ in nodes:
                async with s.get(f"http://{address}/f.bin", headers={"Host": "www.cs.toronto.edu"}) as r:
                    assert r.status == 200 and await r.read() == b"f" * 50_000
        assert origin.requests["/f.bin"] == 1
        proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, proc.wait, 30) == 0
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        assert (tmp_path / "node-0").is_dir() and (tmp_path / "node-1").is_dir()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_help_says_it_never_removes_a_node_and_so_never_drains():
    out = subprocess.run([sys.executable, "-m", "nezha", "up", "--help"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    text = " ".join(out.split())
    assert "never adds or removes a node" in text and "LocalCluster" not in text
    assert "default min(2, NODES)" in text


def _up(tmp_path, base: int, origin_url: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nezha", "up", "--nodes", "2", "--base-port", str(base), "--data-dir",
         str(tmp_path / "up"), "--origin", f"www.cs.toronto.edu={origin_url}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def _started(proc: subprocess.Popen, nodes: int = 2) -> list[list[str]]:
    loop = asyncio.get_running_loop()
    lines: list[str] = []
    while len([x for x in lines if x.startswith("node-")]) < nodes:
        line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 30)
        assert line, f"nezha up exited early with {proc.poll()}: {proc.stderr.read()}"
        lines.append(line.strip())
    return [x.split() for x in lines if x.startswith("node-")]


def test_up_on_taken_ports_fails_with_the_nodes_own_error_line(tmp_path):
    import socket

    base = free_run(2)
    with socket.socket() as s:  # node-0's port is taken; something else answers there
        s.bind(("127.0.0.1", base))
        s.listen()
        run = subprocess.run([sys.executable, "-m", "nezha", "up", "--nodes", "2", "--base-port", str(base),
                              "--data-dir", str(tmp_path), "--origin", "www.cs.toronto.edu=http://127.0.0.1:9"],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "node-0 " not in run.stdout  # never reported as running
    (line,) = [x for x in run.stderr.splitlines() if x.strip()]
    assert line.startswith("nezha up: node-0 exited with code 1: nezha cache: cannot listen on "
                           f"127.0.0.1:{base}"), line


async def test_up_says_when_a_node_dies_and_takes_it_out_of_its_ring(aiohttp_server, redis_server, tmp_path):
    from nezha.index.handle import Index

    server = await aiohttp_server(TestOrigin().app(), host="127.0.0.1")
    proc = _up(tmp_path, free_run(2), f"http://127.0.0.1:{server.port}", "--redis-url", redis_server.url)
    index = Index(redis_url=redis_server.url, node_id=None)
    try:
        nodes = await _started(proc)
        pid = int(nodes[1][2].removeprefix("pid="))
        os.kill(pid, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        said = await asyncio.wait_for(loop.run_in_executor(None, proc.stderr.readline), 10)
        assert said.startswith(f"nezha up: node-1 (pid {pid}) exited with code -9, taken out of the ring"), said
        # Killed, it logged no error: its last ordinary line is labelled, not given as the cause.
        assert ": no error logged; its last line: {" in said, said
        assert (await index.get_membership()).nodes == {"node-0": nodes[0][1]}
        proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, proc.wait, 30) == 0
        # Its ring goes with it: the nodes it named are gone.
        held = await index.get_membership()
        assert held is None or not held.nodes
    finally:
        await index.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_up_refuses_to_replace_a_ring_it_did_not_write_unless_forced_and_can_keep_its_own(
        aiohttp_server, redis_server, tmp_path):
    from nezha.index.handle import Index

    server = await aiohttp_server(TestOrigin().app(), host="127.0.0.1")
    index = Index(redis_url=redis_server.url, node_id=None)
    try:
        await index.set_membership({"nezha-cache-0": "10.0.0.5:8080"})
        run = subprocess.run([sys.executable, "-m", "nezha", "up", "--nodes", "1", "--base-port", str(free_run(1)),
                              "--data-dir", str(tmp_path / "a"), "--redis-url", redis_server.url,
                              "--origin", f"www.cs.toronto.edu=http://127.0.0.1:{server.port}"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, (run.stdout, run.stderr)
        assert "already holds a ring (epoch 1: nezha-cache-0); pass --force to replace it" in run.stderr
        assert (await index.get_membership()).nodes == {"nezha-cache-0": "10.0.0.5:8080"}  # untouched

        proc = _up(tmp_path, free_run(2), f"http://127.0.0.1:{server.port}", "--redis-url", redis_server.url,
                   "--force", "--keep-ring")
        try:
            nodes = await _started(proc)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.get_running_loop().run_in_executor(None, proc.wait, 30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert (await index.get_membership()).nodes == {n[0]: n[1] for n in nodes}  # kept, as asked
    finally:
        await index.close()


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts: it serves nothing)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _reap(proc: subprocess.Popen) -> None:
    """Kill `nezha up` and, should the test have failed, whatever it left running."""
    import psutil

    for pid in _children.pop(proc.pid, ()):
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


_children: dict[int, list[int]] = {}


async def _started_with_children(proc: subprocess.Popen, nodes: int = 2) -> tuple[list[list[str]], list[int]]:
    """The node lines `nezha up` printed, and every process it started (nodes and redis-server)."""
    import psutil

    started = await _started(proc, nodes)
    children = [c.pid for c in psutil.Process(proc.pid).children()]
    node_pids = {int(n[2].removeprefix("pid=")) for n in started}
    _children[proc.pid] = children
    assert node_pids <= set(children) and len(children) == nodes + 1, (started, children)  # + the redis-server
    return started, children


async def test_up_stops_its_nodes_and_its_index_on_sighup(aiohttp_server, tmp_path):
    """A closed terminal (SIGHUP) stops what nezha up started, as SIGINT and SIGTERM do."""

    server = await aiohttp_server(TestOrigin().app(), host="127.0.0.1")
    proc = _up(tmp_path, free_run(2), f"http://127.0.0.1:{server.port}")
    try:
        nodes, children = await _started_with_children(proc)
        proc.send_signal(signal.SIGHUP)
        assert await asyncio.get_running_loop().run_in_executor(None, proc.wait, 30) == 0, proc.stderr.read()
        await _nothing_left(nodes, children)
    finally:
        _reap(proc)


async def _nothing_left(nodes, children) -> None:
    """Until every process `up` started has exited, and no node address answers."""
    from testkit.waits import answers, wait_for

    await wait_for(lambda: all(_gone(pid) for pid in children), timeout=30)
    for _, address, _ in nodes:
        host, port = address.rsplit(":", 1)
        assert not answers(host, int(port))


async def test_up_killed_outright_leaves_no_node_or_index_serving(aiohttp_server, tmp_path):
    """SIGKILL gives nezha up no chance to clean up: its nodes and redis-server end with it anyway."""

    server = await aiohttp_server(TestOrigin().app(), host="127.0.0.1")
    proc = _up(tmp_path, free_run(2), f"http://127.0.0.1:{server.port}")
    try:
        nodes, children = await _started_with_children(proc)
        proc.kill()
        proc.wait()
        await _nothing_left(nodes, children)
    finally:
        _reap(proc)


async def test_ctrl_c_at_the_terminal_stops_up_without_an_index_warning(aiohttp_server, tmp_path):
    """Ctrl-C signals the terminal's whole foreground group: nezha up stops its nodes before its
    index, so nothing reports the index lost (`index_degraded`) on the way out."""
    server = await aiohttp_server(TestOrigin().app(), host="127.0.0.1")
    base = free_run(2)
    # Its own process group stands for the terminal's foreground group, which Ctrl-C signals.
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "up", "--nodes", "2", "--base-port", str(base), "--data-dir",
         str(tmp_path / "up"), "--origin", f"www.cs.toronto.edu=http://127.0.0.1:{server.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        await _started_with_children(proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = await asyncio.get_running_loop().run_in_executor(None, lambda: proc.communicate(timeout=60))
        assert proc.returncode == 0, err
        logs = out + err + "".join(p.read_text() for p in (tmp_path / "up").glob("node-*.log"))
        assert "index_degraded" not in logs, logs
    finally:
        _reap(proc)


from testkit.waits import wait_for  # noqa: E402


def _clean_env(**extra: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_") or k.startswith("NEZHA_TEST_")}
    return {**clean, **extra}


async def test_up_takes_node_settings_from_config_environment_and_flags_fills_node_logs_and_names_its_stats_command(
        aiohttp_server, tmp_path):
    """One settings model: origins and the base port from --config, the capacity from NEZHA_CAPACITY, the log
    level from the flag; every node gets them, logs to DIR/node-i.log, and `nezha stats` reads their numbers."""
    import json

    origin = TestOrigin()
    origin.put("/big.bin", b"b" * 50_000)
    origin.put("/small.bin", b"s" * 1_000)
    server = await aiohttp_server(origin.app(), host="127.0.0.1")
    base = free_run(1)
    config = tmp_path / "up.yaml"
    config.write_text(f"nodes: 1\nbase_port: {base}\norigins:\n  - host: www.cs.toronto.edu\n"
                      f"    upstream: http://127.0.0.1:{server.port}\n")
    proc = subprocess.Popen([sys.executable, "-m", "nezha", "up", "--config", str(config), "--data-dir",
                             str(tmp_path / "up"), "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_clean_env(NEZHA_CAPACITY="10KB"))
    loop = asyncio.get_running_loop()
    try:
        lines: list[str] = []
        while not any(x.startswith("stats: ") for x in lines):
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 30)
            assert line, f"nezha up exited early with {proc.poll()}: {proc.stderr.read()}"
            lines.append(line.strip())
        assert f"node-0 127.0.0.1:{base} pid={proc.pid}" not in lines  # the node's own pid, not up's
        assert any(x.startswith(f"node-0 127.0.0.1:{base} pid=") for x in lines), lines
        (command,) = [x.removeprefix("stats: ") for x in lines if x.startswith("stats: ")]
        assert command.startswith("nezha stats --redis-url redis://127.0.0.1:"), command

        async def cache_of(s: aiohttp.ClientSession, path: str) -> str:
            async with s.get(f"http://127.0.0.1:{base}{path}", headers={"Host": "www.cs.toronto.edu"}) as r:
                await r.read()
                return r.headers["X-Nezha-Cache"]

        async with aiohttp.ClientSession() as s:
            assert await cache_of(s, "/small.bin") == "miss"

            async def hit() -> bool:
                return await cache_of(s, "/small.bin") == "hit"

            await wait_for(hit, timeout=10)  # once its fill is committed
            # Larger than NEZHA_CAPACITY: passed on, never kept (without the capacity: miss, then hit).
            assert [await cache_of(s, "/big.bin") for _ in range(2)] == ["pass", "pass"]
        log = (tmp_path / "up" / "node-0.log").read_text()
        assert '"event": "request_completed"' in log, log

        def stats() -> dict:
            run = subprocess.run([sys.executable, "-m", *command.split(), "--json"],
                                 capture_output=True, text=True, timeout=30, env=_clean_env())
            assert run.returncode == 0, run.stderr
            return json.loads(run.stdout)

        await wait_for(lambda: stats()["nodes"].get("node-0", {}).get("hits") == 1, timeout=15)
        proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, proc.wait, 30) == 0
    finally:
        _reap(proc)


async def test_up_gives_each_node_a_tls_port_from_tls_base_port(aiohttp_server, tmp_path):
    from testkit.waits import answers

    server = await aiohttp_server(TestOrigin().app(), host="127.0.0.1")
    tls = free_run(2)
    proc = _up(tmp_path, free_run(2), f"http://127.0.0.1:{server.port}", "--tls-base-port", str(tls))
    try:
        nodes = await _started(proc)
        assert [n[3] for n in nodes] == [f"tls=127.0.0.1:{tls}", f"tls=127.0.0.1:{tls + 1}"]
        assert answers("127.0.0.1", tls) and answers("127.0.0.1", tls + 1)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.get_running_loop().run_in_executor(None, proc.wait, 30) == 0
    finally:
        _reap(proc)


async def test_a_second_up_on_the_same_data_dir_refuses_naming_the_folder_and_the_first(aiohttp_server, tmp_path):
    """Two clusters on one folder would share its node folders, index and settings file."""
    server = await aiohttp_server(TestOrigin().app(), host="127.0.0.1")
    first = _up(tmp_path, free_run(2), f"http://127.0.0.1:{server.port}")
    try:
        nodes = await _started(first)
        second = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "nezha", "up", "--nodes", "2", "--base-port", str(free_run(2)), "--data-dir",
            str(tmp_path / "up"), "--origin", f"www.cs.toronto.edu=http://127.0.0.1:{server.port}"],
            capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, (second.stdout, second.stderr)
        assert "node-0 " not in second.stdout  # nothing started
        (line,) = [x for x in second.stderr.splitlines() if x.strip()]
        assert line == (f"nezha up: --data-dir {str(tmp_path / 'up')!r} is in use by pid {first.pid} (nezha up): "
                        "one node per data folder; stop it, or give this one a folder of its own")
        async with aiohttp.ClientSession() as s:  # the first cluster is untouched
            for _, address, *_ in nodes:
                async with s.get(f"http://{address}/readyz") as r:
                    assert r.status == 200
        first.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(first.wait, 30) == 0
    finally:
        _reap(first)


def test_up_with_overlapping_http_and_tls_port_ranges_names_both_flags_before_starting_anything(tmp_path):
    """It used to start node-0, whose TLS port was node-1's HTTP port, and blame node-1's --listen."""
    base = free_run(3)
    run = subprocess.run([sys.executable, "-m", "nezha", "up", "--nodes", "2", "--base-port", str(base),
                          "--tls-base-port", str(base + 1), "--data-dir", str(tmp_path / "up"),
                          "--origin", "www.cs.toronto.edu=http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, (run.stdout, run.stderr)
    (line,) = [x for x in run.stderr.splitlines() if x.strip()]
    assert line == (f"nezha up: --base-port {base} and --tls-base-port {base + 1} overlap: with 2 node(s), node-1 "
                    f"would listen on {base + 1} and node-0 answer TLS on it; give the ranges 2 ports apart "
                    f"(e.g. --tls-base-port {base + 2})")
    assert not (tmp_path / "up" / "node-0.log").exists()  # no node was started
