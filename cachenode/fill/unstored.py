"""Why a fill's bytes reached its clients but not the store: a body
nothing proves whole, one the store could not write, one a write to its
URL made stale, an on-demand fill's partial nobody read on. Raised by the
fill buffer (cachenode/fill/buffer.py), the fill's run (cachenode/fill/
running.py) and its parallel fetch (cachenode/fill/parallel.py); a flight (cachenode/fill/
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


class PartialDropped(NotStored):
    """An on-demand fill (the origin's fill_on_range off) kept only the ranges
    clients asked for, and nobody asked for more for a while: its slices are
    dropped, never stored."""
