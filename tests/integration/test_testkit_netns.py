"""testkit.netns: namespaces joined by shaped links are built, used, and deleted without a trace, also when
the set-up fails half-way. Runs as root (CI is root); elsewhere it skips, and in CI a missing piece fails it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from testkit.netns import SUBNET, Host, Network, NetnsError, NetnsUnavailable, check_available, namespaces
from testkit.tools import unavailable

# A server that sends SIZE bytes to whoever connects, and a client that reads them and prints the seconds taken.
SEND = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind((sys.argv[1], 9000)); s.listen(); print('listening', flush=True); c,_=s.accept(); "
        "c.sendall(b'x'*int(sys.argv[2])); c.close()")
RECV = ("import socket,sys,time; t=time.monotonic(); c=socket.create_connection((sys.argv[1], 9000), timeout=30); n=0\n"
        "while True:\n  d=c.recv(1<<16)\n  n+=len(d)\n  if not d: break\n"
        "print(n, time.monotonic()-t)")


@pytest.fixture
def netns_possible():
    try:
        check_available()
    except NetnsUnavailable as e:
        unavailable(str(e))


needs_netns = pytest.mark.usefixtures("netns_possible")


def links() -> list[str]:
    """The interfaces of the machine's own namespace."""
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout.split("\n")


def ours(tag: str) -> list[str]:
    return [ns for ns in namespaces() if ns.startswith(tag)]


@needs_netns
def test_hosts_reach_each_other_over_links_shaped_both_ways_and_nothing_is_left_after():
    before = len(links())
    net = Network(hosts=[Host("origin", rate=1_000_000), Host("client", rate=0)], burst=32 * 1024, latency=0.05)
    with net:
        assert sorted(ours(net.tag)) == sorted([net.bridge_ns, net.namespace("origin"), net.namespace("client")])
        assert len(links()) == before, "a link appeared in the machine's own namespace"
        sending, receiving = net.qdiscs("origin")
        assert "tbf" in sending and "rate 8Mbit" in sending and "burst 32Kb" in sending, sending
        assert "tbf" in receiving and "rate 8Mbit" in receiving, receiving
        assert net.qdiscs("client") == ("qdisc noqueue 0: root refcnt 2", "qdisc noqueue 0: root refcnt 2")
        for host in ("origin", "client"):
            routes = subprocess.run(["ip", "-n", net.namespace(host), "route", "show"], capture_output=True,
                                    text=True, check=True).stdout
            assert routes.split() [:1] == [f"{SUBNET}.0/24"] and "default" not in routes, routes
            out = subprocess.run(["ip", "-n", net.namespace(host), "route", "get", "1.1.1.1"], capture_output=True,
                                 text=True)
            assert out.returncode != 0 and "unreachable" in out.stderr, "a namespace has a way out"
        # 3 MB over the origin's 1 MB/s link: at least 2.5 s (the bucket's 32 KiB burst is all it may send early).
        size = 3_000_000
        server = subprocess.Popen(net.argv("origin", sys.executable, "-c", SEND, net.address("origin"), str(size)),
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "listening"
            got = subprocess.run(net.argv("client", sys.executable, "-c", RECV, net.address("origin")),
                                 capture_output=True, text=True, timeout=30, check=True).stdout.split()
        finally:
            server.wait(timeout=10)
        assert int(got[0]) == size
        assert float(got[1]) >= 2.5, f"{size} bytes took {got[1]} s over a 1 MB/s link"
        sent, received = net.counters()["origin"]
        assert sent >= size and received < size // 10, (sent, received)
    assert ours(net.tag) == []
    assert len(links()) == before


@needs_netns
def test_a_process_still_running_inside_is_stopped_and_its_namespace_deleted():
    net = Network(hosts=[Host("node")])
    with net:
        sleeper = subprocess.Popen(net.argv("node", "sleep", "300"))
        time.sleep(0.2)
    assert sleeper.wait(timeout=10) != 0
    assert ours(net.tag) == []


@needs_netns
@pytest.mark.parametrize("fail_at", [1, 4, 9, 17, "last"])
def test_a_failure_injected_mid_set_up_leaves_nothing_behind(fail_at):
    hosts = [Host("node0", rate=2_000_000), Host("node1", rate=2_000_000), Host("origin", rate=1_000_000)]
    steps: list[list[str]] = []
    with Network(hosts=hosts, before_step=steps.append):
        pass
    at = len(steps) if fail_at == "last" else fail_at
    assert at <= len(steps)
    before = len(links())
    seen = 0

    def fail(argv: list[str]) -> None:
        nonlocal seen
        seen += 1
        if seen == at:
            raise NetnsError(f"injected failure before step {at}: {' '.join(argv)}")

    net = Network(hosts=hosts, before_step=fail)
    with pytest.raises(NetnsError, match="injected failure"):
        with net:
            raise AssertionError("the network was built although a step failed")
    assert ours(net.tag) == []
    assert len(links()) == before


@needs_netns
def test_a_command_that_fails_is_named_and_undone():
    net = Network(hosts=[Host("node0"), Host("node1")])
    net.bridge_ns  # noqa: B018 (named before the clash below is arranged)
    subprocess.run(["ip", "netns", "add", net.namespace("node1")], check=True)
    try:
        with pytest.raises(NetnsError, match=rf"ip netns add {net.namespace('node1')} exited"):
            net.build()
        assert ours(net.tag) == [net.namespace("node1")], "only the namespace this run did not make is left"
    finally:
        subprocess.run(["ip", "netns", "delete", net.namespace("node1")], check=True)


def test_a_caller_who_is_not_root_is_refused_with_the_cause(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(NetnsUnavailable, match="network namespaces need root"):
        Network(hosts=[Host("node")]).build()


def test_a_machine_without_iproute2_is_refused_naming_the_package(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(NetnsUnavailable, match="ip and tc not found: install Debian's iproute2"):
        Network(hosts=[Host("node")]).build()


@needs_netns
def test_the_calling_thread_steps_inside_a_host_and_back_out():
    import socket

    def bind(address: str) -> bool:
        with socket.socket() as s:
            try:
                s.bind((address, 0))
            except OSError:
                return False
            return True

    mine = os.stat("/proc/thread-self/ns/net").st_ino
    with Network(hosts=[Host("node")]) as net:
        assert not bind(net.address("node"))
        with net.inside("node"):
            assert os.stat("/proc/thread-self/ns/net").st_ino == os.stat(f"/run/netns/{net.namespace('node')}").st_ino
            assert bind(net.address("node"))
            inner = subprocess.run(["ip", "-o", "addr", "show", "dev", "eth0"], capture_output=True, text=True)
            assert net.address("node") in inner.stdout, "a process started inside is not inside"
        assert os.stat("/proc/thread-self/ns/net").st_ino == mine
        assert not bind(net.address("node"))
