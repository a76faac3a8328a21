"""Answers that carry no object: 304 or 412 for a precondition, 416 for a
Range nothing satisfies, and 502 or 504 for an origin that failed.
"""

from __future__ import annotations

from aiohttp import web

from cachenode.http.conditionals import Outcome as RangeOutcome
from nezha.credentials import redact_text
from nezha.errors import NezhaError, OriginTimeout
from nezha.wire import ORIGIN_ERROR_HEADER, origin_error_value


def origin_failure(error: NezhaError | None) -> web.HTTPException:
    """502 for an origin that failed, 504 for one that did not answer in time.

    Marked with ORIGIN_ERROR_HEADER, so that a relaying peer passes the answer
    on instead of blaming this node and asking the same origin elsewhere.
    """
    cls = web.HTTPGatewayTimeout if isinstance(error, OriginTimeout) else web.HTTPBadGateway
    # A fill's error names the leader's URL, which every joiner is told:
    # its signature is the leader's, not theirs (nezha/credentials.py).
    said = redact_text(str(error))
    return cls(text=f"{said}\n", headers={ORIGIN_ERROR_HEADER: origin_error_value(said)})


async def answer_precondition(request: web.Request, resp: web.StreamResponse, outcome: RangeOutcome) -> None:
    """304 or 412 with the object's validators and no body (RFC 9110 §15.4.5, §15.5.13)."""
    for h in ("Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition"):
        resp.headers.popall(h, None)
    resp.set_status(outcome.value)
    resp.content_length = 0 if outcome is RangeOutcome.PRECONDITION_FAILED else None
    await resp.prepare(request)
    await resp.write_eof()


async def answer_unsatisfiable(request: web.Request, resp: web.StreamResponse, size: int) -> None:
    """416 for a Range no byte of a `size`-byte object satisfies (RFC 9110 §15.5.17)."""
    resp.set_status(416)
    resp.headers["Content-Range"] = f"bytes */{size}"
    resp.content_length = 0
    await resp.prepare(request)
    await resp.write_eof()
