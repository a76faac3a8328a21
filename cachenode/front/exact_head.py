"""Response heads that carry the origin's header bytes exactly as they came.

HTTP field values are octets (RFC 9110 §5.5): a UTF-8 `Content-Disposition`
filename or a stray 0xFF in `Content-Type` is legal on the wire. aiohttp's
client hands such bytes over as `str` decoded UTF-8 with surrogateescape, and
the stored metadata keeps them that way; encoding back the same way gives the
origin's bytes again. aiohttp's own serializer cannot: it encodes strict UTF-8
and its C version silently drops the surrogates, so a header would reach a
client altered, and differently on the fast path (which writes its own
heads) than on the handler path. Every path that forwards origin fields
therefore writes its head through here.
"""

from __future__ import annotations

from typing import Iterable

from aiohttp import web


def encode_head(status_line: str, fields: Iterable[tuple[str, str]]) -> bytes:
    """Status line, field lines and the blank line, as the origin's octets."""
    return encode_lines([status_line, *[f"{name}: {value}" for name, value in fields], "", ""])


def encode_lines(lines: list[str]) -> bytes:
    """A head's lines already written out (`name: value`), joined by CRLF, as
    the origin's octets: for a head made once per answer, whose lines cost
    less written as they are read than gathered as pairs first
    (front/plain.py `response_head`)."""
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def _carries_raw_bytes(text: str) -> bool:
    # An ASCII value (nearly every one) has no surrogate: no scan of it character by character.
    return not text.isascii() and any("\udc80" <= ch <= "\udcff" for ch in text)


class ExactResponse(web.StreamResponse):
    """A StreamResponse whose head keeps raw origin bytes.

    Only a head that holds such bytes is serialized here; every other goes
    through aiohttp unchanged. The head is handed to aiohttp's writer where its
    own serializer would have put it, so buffering, hooks and `Connection`
    handling stay aiohttp's (tests/integration/cachenode/test_header_bytes.py
    fails if a new aiohttp moves that place).
    """

    async def _write_headers(self) -> None:
        if not any(_carries_raw_bytes(v) for v in self.headers.values()) and not _carries_raw_bytes(self.reason):
            await super()._write_headers()
            return
        request = self._req
        writer = self._payload_writer
        assert request is not None and writer is not None
        status_line = f"HTTP/{request.version[0]}.{request.version[1]} {self.status} {self.reason}"
        await writer.write_headers(status_line, self.headers)
        writer._headers_buf = encode_head(status_line, self.headers.items())
        if self._send_headers_immediately:
            writer.send_headers()
