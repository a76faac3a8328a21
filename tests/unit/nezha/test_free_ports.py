"""Ports handed to servers that must be told theirs lie below the kernel's
ephemeral range, where no outgoing connection takes them meanwhile."""

import socket

from nezha.localproc import _ephemeral_low, free_port, free_run


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound():
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_run_of_free_ports_stays_below_the_ephemeral_range():
    low = _ephemeral_low()
    base = free_run(16)
    assert base + 16 <= low
