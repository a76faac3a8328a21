"""Why a fill's bytes reached its clients but not the store: a body
nothing proves whole, one the store could not write, one a write to its
URL made stale. Raised by the fill buffer (cachenode/fill/buffer.py) and
the fill's run (cachenode/fill/running.py); a flight (cachenode/fill/
flights.py) logs them as not stored, not as failed: the clients were served.
"""

from __future__ import annotations

from cachenode.store.objects import NotStored


class Superseded(NotStored):
    """A write to the URL succeeded while its fill ran: what the fill got may
    predate the write, so it is streamed to its clients but never stored."""


class Unprovable(NotStored):
    """The body ended where the origin closed its connection (no Content-Length,
    no chunked framing; RFC 9112 §6.3): nothing proves it whole, so it was
    streamed to its clients and never stored."""


class StoreUnwritable(NotStored):
    """The store could not write the body (ENOSPC, EDQUOT, EIO...): it was
    streamed to its clients from memory and never stored."""
