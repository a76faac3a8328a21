"""A nameserver on a loopback address that answers A records from a table
(NXDOMAIN for any other name): what a pod's resolver asks, for tests of
names that must not come from the pod's /etc/hosts (a sidecar's origins
resolve to the sidecar there; the sidecar's own /etc/hosts names none)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import AsyncIterator


class Nameserver(asyncio.DatagramProtocol):
    """A recursive nameserver's answers for `records` (name -> IPv4; the
    table may be replaced while it runs), NXDOMAIN for any other name, no
    AAAA. What is not a question is dropped, as a server drops garbage."""

    def __init__(self, records: dict[str, str], *, ttl: int = 60) -> None:
        self.records = records
        self.ttl = ttl
        self.asked: list[tuple[str, int]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        try:
            ident, flags = struct.unpack_from("!HH", data)
            at, labels = 12, []
            while data[at]:
                labels.append(data[at + 1:at + 1 + data[at]].decode("ascii", "replace"))
                at += 1 + data[at]
            (qtype,) = struct.unpack_from("!H", data, at + 1)
        except (struct.error, IndexError):
            return
        qname = ".".join(labels).lower().rstrip(".")
        question = data[12:at + 5]
        self.asked.append((qname, qtype))
        ip = self.records.get(qname)
        answer = b""
        if ip is not None and qtype == 1:
            answer = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, self.ttl, 4) + socket.inet_aton(ip)
        rcode = 0 if ip is not None else 3
        head = struct.pack("!HHHHHH", ident, 0x8180 | (flags & 0x0100) | rcode, 1, 1 if answer else 0, 0, 0)
        assert self.transport is not None
        self.transport.sendto(head + question + answer, addr)


@contextlib.asynccontextmanager
async def serving(records: dict[str, str], *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[Nameserver]:
    """A `Nameserver` for `records` on host:port (its `port` set) while the block runs. Port 53 is
    where /etc/resolv.conf can name it, as it cannot say another port."""
    server = Nameserver(records)
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: server,
                                                                              local_addr=(host, port))
    server.port = transport.get_extra_info("sockname")[1]
    try:
        yield server
    finally:
        transport.close()
