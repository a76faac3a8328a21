"""A nameserver on 127.0.0.1 that answers A records from a table (NXDOMAIN for
any other name): what a pod's resolver asks, for tests of names that must
not come from /etc/hosts (a sidecar's origins resolve to the sidecar there)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import AsyncIterator


class Nameserver(asyncio.DatagramProtocol):
    """A recursive nameserver's answers for `records` (name -> IPv4), NXDOMAIN for any other name."""

    def __init__(self, records: dict[str, str]) -> None:
        self.records = records
        self.asked: list[tuple[str, int]] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        ident = struct.unpack_from("!H", data)[0]
        at, labels = 12, []
        while data[at]:
            labels.append(data[at + 1:at + 1 + data[at]].decode())
            at += 1 + data[at]
        qname, (qtype,) = ".".join(labels), struct.unpack_from("!H", data, at + 1)
        question = data[12:at + 5]
        self.asked.append((qname, qtype))
        ip = self.records.get(qname)
        records, rcode = b"", 0 if ip else 3
        if ip and qtype == 1:
            records = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
        head = struct.pack("!HHHHHH", ident, 0x8180 | rcode, 1, 1 if records else 0, 0, 0)
        self.transport.sendto(head + question + records, addr)


@contextlib.asynccontextmanager
async def serving(records: dict[str, str]) -> AsyncIterator[Nameserver]:
    """A `Nameserver` for `records` on 127.0.0.1 (its `port` set) while the block runs."""
    server = Nameserver(records)
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: server,
                                                                              local_addr=("127.0.0.1", 0))
    server.port = transport.get_extra_info("sockname")[1]
    try:
        yield server
    finally:
        transport.close()
