"""DNS messages for asking a nameserver for an origin's addresses (RFC 1035 §4). Pure: no I/O.

Why a node speaks DNS itself: in a training pod the webhook aliases every
dataset host to 127.0.0.1 (hostAliases, written into the pod's
/etc/hosts), and the sidecar shares that file. Resolved the usual way, an
origin's name is the sidecar itself, and a sidecar whose parent is down
could never reach the origin. So a node with a parent asks the nameservers
of /etc/resolv.conf (cachenode/fill/dns_resolver.py) and never reads
/etc/hosts for origin names. Only what that needs: one question (A or
AAAA, recursion desired), the addresses in the answer section (a CNAME
chain, which recursive servers resolve for the client, is skipped over).
"""

from __future__ import annotations

import ipaddress
import struct

A = 1
AAAA = 28
CNAME = 5
_IN = 1
_HEADER = struct.Struct("!HHHHHH")


class DnsError(ValueError):
    """A nameserver's answer that names no address (an error code, a truncated
    or malformed message), or a name that is no domain name."""


def query(name: str, qtype: int, ident: int) -> bytes:
    """The message asking for `name`'s records of `qtype`, with recursion desired."""
    try:
        labels = name.rstrip(".").encode("idna").split(b".")
    except UnicodeError:
        labels = [b""]
    if not all(0 < len(label) < 64 for label in labels):
        raise DnsError(f"{name!r} is not a domain name")
    question = b"".join(bytes([len(label)]) + label for label in labels) + b"\0" + struct.pack("!HH", qtype, _IN)
    return _HEADER.pack(ident, 0x0100, 1, 0, 0, 0) + question


def _skip_name(data: bytes, at: int) -> int:
    """The offset just past the (possibly compressed) name at `at`."""
    while True:
        if at >= len(data):
            raise DnsError("message ends inside a name")
        length = data[at]
        if length & 0xC0 == 0xC0:
            return at + 2  # a pointer ends the name
        if length == 0:
            return at + 1
        at += 1 + length


def addresses(data: bytes, *, ident: int, qtype: int) -> list[str]:
    """The addresses of type `qtype` in the answer to the query `ident`.
    Raises DnsError for another query's answer, an error code, or truncation."""
    if len(data) < _HEADER.size:
        raise DnsError("message shorter than its header")
    got, flags, qdcount, ancount, _, _ = _HEADER.unpack_from(data)
    if got != ident or not flags & 0x8000:
        raise DnsError("not the answer to this query")
    if flags & 0x0200:
        raise DnsError("answer truncated")
    rcode = flags & 0x000F
    if rcode == 3:
        raise DnsError("no such name (NXDOMAIN)")
    if rcode:
        raise DnsError(f"nameserver answered rcode {rcode}")
    at = _HEADER.size
    for _ in range(qdcount):
        at = _skip_name(data, at) + 4
    found = []
    for _ in range(ancount):
        at = _skip_name(data, at)
        if at + 10 > len(data):
            raise DnsError("message ends inside a record")
        rtype, rclass, _ttl, length = struct.unpack_from("!HHIH", data, at)
        at += 10
        rdata = data[at:at + length]
        if len(rdata) != length:
            raise DnsError("message ends inside a record's data")
        at += length
        if rclass == _IN and rtype == qtype == A and length == 4:
            found.append(str(ipaddress.IPv4Address(rdata)))
        elif rclass == _IN and rtype == qtype == AAAA and length == 16:
            found.append(str(ipaddress.IPv6Address(rdata)))
    return found


class ResolvConf:
    """What a resolv.conf says (resolv.conf(5)): nameservers (at most three,
    as libc uses), the search list and `ndots`, so a short in-cluster name
    (`minio.storage`) is tried under the pod's search domains first, as
    the pod's own resolver would."""

    def __init__(self, text: str) -> None:
        self.nameservers: list[str] = []
        self.search: list[str] = []
        self.ndots = 1
        for line in text.splitlines():
            parts = line.split("#", 1)[0].split(";", 1)[0].split()
            if len(parts) < 2:
                continue
            if parts[0] == "nameserver" and len(self.nameservers) < 3:
                try:
                    self.nameservers.append(str(ipaddress.ip_address(parts[1].split("%", 1)[0])))
                except ValueError:
                    continue
            elif parts[0] in ("search", "domain"):
                self.search = [d.rstrip(".") for d in parts[1:] if d != "."]
            elif parts[0] == "options":
                for option in parts[1:]:
                    if option.startswith("ndots:") and option[6:].isdigit():
                        self.ndots = min(15, int(option[6:]))

    def candidates(self, name: str) -> list[str]:
        """The names to ask for, in order: a name ending in a dot as it is;
        one with fewer than `ndots` dots under each search domain first."""
        if name.endswith("."):
            return [name.rstrip(".")]
        searched = [f"{name}.{domain}" for domain in self.search]
        return [*searched, name] if name.count(".") < self.ndots else [name, *searched]
