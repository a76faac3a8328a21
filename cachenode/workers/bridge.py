"""Two transports joined end to end: a follower's TLS client and the primary.

A follower worker makes the TLS handshakes that land on it and serves their
plain hits (the CPU that scales with workers), but no HTTP beyond that, and
a TLS connection's state cannot be handed to another process with its
descriptor. So at the first request it does not answer, it joins the
client's TLS transport to one end of a fresh socketpair and hands the other
end to the primary, which serves the requests in the clear as https
(cachenode/workers/follower.py). What one
side receives the other writes, with flow control both ways: a side whose
peer's buffer is full stops reading, so a slow client holds a buffer's
worth here, not the object.
"""

from __future__ import annotations

import asyncio


class Half(asyncio.Protocol):
    """One side of a bridge; `peer` is the other."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Half | None = None
        self._early = bytearray()  # what arrived before the peer was connected
        self._eof_early = False

    def hold(self, received: bytes, eof: bool) -> None:
        """Bytes (and an end) this side's transport delivered before it joined
        the bridge: they go to the peer first, once it is connected."""
        self._early += received
        self._eof_early = self._eof_early or eof
        if self.transport is not None and (self.peer is None or self.peer.transport is None):
            self.transport.pause_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = self.peer
        if peer is not None and peer.transport is not None:
            if peer._early:
                self.transport.write(bytes(peer._early))
                peer._early.clear()
            if peer._eof_early:
                self._end()
            peer.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._early += data
            assert self.transport is not None
            self.transport.pause_reading()
            return
        peer.transport.write(data)

    def eof_received(self) -> bool:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._eof_early = True
        else:
            peer._end()
        # Keep our side open for what the peer still sends; TLS has no
        # half-close (asyncio closes after close_notify, and warns at True).
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def _end(self) -> None:
        """Our peer has nothing more to send: say so to our side."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()  # TLS has no half-close: close_notify, after what is buffered

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            peer.transport.close()  # after what it holds is written


def pair() -> tuple[Half, Half]:
    a, b = Half(), Half()
    a.peer, b.peer = b, a
    return a, b
