"""The server name a TLS client asks for, read from its ClientHello. Pure.

A job whose host name the webhook aliased to the cache connects to the
cache's port 443 when its URL is `https://`. For a name it does not
terminate, the cache hands the connection on untouched to the real host,
and for one it does it must pick the certificate; both need the name, which
is named only in the ClientHello's server_name extension (SNI,
RFC 6066 §3), sent in the clear before any key exchange. This reads just
enough of the TLS record layer (RFC 8446 §5.1) and the ClientHello
(§4.1.2; the same layout since TLS 1.0) to find it, and says how many bytes
the hello took, so they can be forwarded as they came.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_HELLO = 64 * 1024  # a ClientHello this large is not one a client sends; stop buffering
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0
_HOST_NAME = 0


class NotClientHello(ValueError):
    """The bytes are not the start of a TLS connection this node can route."""


@dataclass(frozen=True)
class Hello:
    server_name: str | None  # lowercased, without a trailing dot; None when the client sent no SNI
    size: int  # bytes of the records that carried the whole ClientHello


def alert(description: int) -> bytes:
    """A fatal TLS alert record (RFC 8446 §6): 112 unrecognized_name, 40 handshake_failure."""
    return bytes([21, 3, 3, 0, 2, 2, description])


UNRECOGNIZED_NAME = 112
HANDSHAKE_FAILURE = 40


def read_client_hello(buf: bytes | bytearray | memoryview) -> Hello | None:
    """The ClientHello at the start of `buf`; None if more bytes are needed.

    Raises NotClientHello for anything else: plain HTTP, another record
    type, a malformed or oversized hello.
    """
    data = bytes(buf[:MAX_HELLO + 5])
    body = bytearray()  # the handshake messages, records unwrapped
    offset = 0
    while True:
        if len(data) - offset < 5:
            if offset == 0 and data and data[0] != _HANDSHAKE:
                raise NotClientHello(f"first byte {data[0]:#04x} is not a TLS handshake record")
            return _need(len(data))
        kind, major, length = data[offset], data[offset + 1], int.from_bytes(data[offset + 3:offset + 5], "big")
        if kind != _HANDSHAKE:
            raise NotClientHello(f"record type {kind} where a handshake record was expected")
        if major != 3:
            raise NotClientHello(f"record version {major}.{data[offset + 2]} is not TLS")
        if length == 0 or length > 16384 + 2048:
            raise NotClientHello(f"record length {length} is out of bounds")
        end = offset + 5 + length
        if end > len(data):
            return _need(len(data))
        body += data[offset + 5:end]
        offset = end
        if len(body) >= 4:
            if body[0] != _CLIENT_HELLO:
                raise NotClientHello(f"handshake message type {body[0]} is not a ClientHello")
            wanted = 4 + int.from_bytes(body[1:4], "big")
            if wanted > MAX_HELLO:
                raise NotClientHello(f"a ClientHello of {wanted} bytes is larger than {MAX_HELLO}")
            if len(body) >= wanted:
                return Hello(server_name=_server_name(bytes(body[4:wanted])), size=offset)


def _need(have: int) -> None:
    if have >= MAX_HELLO + 5:
        raise NotClientHello(f"no complete ClientHello in the first {MAX_HELLO} bytes")
    return None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise NotClientHello(f"ClientHello ends inside its {what}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def number(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "big")

    def vector(self, size: int, what: str) -> bytes:
        return self.take(self.number(size, f"{what} length"), what)


def _server_name(hello: bytes) -> str | None:
    r = _Reader(hello)
    r.take(2 + 32, "version and random")
    r.vector(1, "session id")
    r.vector(2, "cipher suites")
    r.vector(1, "compression methods")
    if r.pos == len(hello):
        return None  # no extensions at all
    extensions = _Reader(r.vector(2, "extensions"))
    while extensions.pos < len(extensions.data):
        kind = extensions.number(2, "extension type")
        data = extensions.vector(2, "extension")
        if kind != _SERVER_NAME:
            continue
        names = _Reader(data)
        listed = _Reader(names.vector(2, "server name list"))
        while listed.pos < len(listed.data):
            name_type = listed.number(1, "server name type")
            name = listed.vector(2, "server name")
            if name_type == _HOST_NAME:
                try:
                    text = name.decode("ascii")
                except UnicodeDecodeError as e:
                    raise NotClientHello("server name is not ASCII") from e
                if not text or any(c in text for c in "\x00/ \\"):
                    raise NotClientHello(f"server name {text!r} is not a host name")
                return text.lower().rstrip(".")
        return None
    return None
