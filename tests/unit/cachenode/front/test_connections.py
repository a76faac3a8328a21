"""The connection cap's decisions, without sockets (cachenode/front/connections.py)."""

from __future__ import annotations

from dataclasses import dataclass

from cachenode.front.connections import (BUSY_RESPONSE, PER_CONNECTION, RESERVED_DESCRIPTORS, Gate, choose_reclaim,
                                   default_max_connections, head_timeout_response, listen_backlog)


@dataclass(eq=False)
class Conn:
    waiting: bool
    waiting_since: float
    reclaimed: bool = False

    def reclaim(self) -> None:
        self.reclaimed = True


def test_the_connection_waiting_longest_is_reclaimed_and_a_busy_one_never():
    busy_old = Conn(False, 0.0)
    idle_new, idle_old = Conn(True, 50.0), Conn(True, 10.0)
    assert choose_reclaim([busy_old, idle_new, idle_old]) is idle_old
    assert choose_reclaim([busy_old]) is None


def test_below_the_cap_everyone_is_admitted_and_at_it_the_stalest_waiter_gives_way():
    gate = Gate(2)
    a, b, c = Conn(True, 1.0), Conn(True, 2.0), Conn(True, 3.0)
    assert gate.admit(a) and gate.admit(b)
    assert gate.admit(c)
    assert a.reclaimed and not b.reclaimed and gate.open == {b, c} and gate.reclaimed == 1


def test_when_all_are_busy_the_newcomer_is_refused_and_nobody_is_closed():
    gate = Gate(1)
    busy = Conn(False, 0.0)
    assert gate.admit(busy)
    assert not gate.admit(Conn(True, 5.0))
    assert not busy.reclaimed and gate.refused == 1 and gate.open == {busy}


def test_a_connection_handed_to_another_protocol_is_counted_once():
    gate = Gate(4)
    first = Conn(True, 0.0)
    gate.admit(first)
    gate.leave(first)
    second = Conn(True, 0.0)
    gate.enter(second)
    assert gate.open == {second}


def test_the_cap_leaves_descriptors_for_files_origins_peers_and_an_accept_burst_per_listener():
    for open_files in (256, 1024, 4096, 65_536, 1_048_576):
        at_cap = default_max_connections(open_files) * PER_CONNECTION
        bursts = 2 * listen_backlog(open_files)  # the plain and TLS ports each accept a backlog at once
        assert at_cap + bursts + RESERVED_DESCRIPTORS <= open_files
        assert at_cap > open_files // 3  # and still most of them go to clients
    assert default_max_connections(256) == 64
    assert default_max_connections(16) == 8  # never zero, even on an absurd limit


def test_the_listen_backlog_grows_with_the_descriptors_within_bounds():
    assert listen_backlog(256) == 32
    assert listen_backlog(64) == 16
    assert listen_backlog(1_048_576) == 1024


def test_the_answers_are_complete_http_messages_that_close():
    for raw, status in ((BUSY_RESPONSE, b"503"), (head_timeout_response(30), b"408")):
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == status and b"Connection: close" in head
        assert f"Content-Length: {len(body)}".encode() in head
    assert b"Retry-After: 1" in BUSY_RESPONSE
