"""What a flight's leader does with the answer it got (cachenode/fill/lead.py)."""

from __future__ import annotations

import pytest

from cachenode.fill.lead import Answer, Decision, Step, decide
from cachenode.http.freshness import Policy
from cachenode.http.headers import MAX_STORED_HEADER_BYTES

FRESH = Policy(storable=True, reason="ok", ttl=600.0)


def answer(**changes) -> Answer:
    """A storable 200 from the origin, with `changes`."""
    return Answer(**{"status": 200, "policy": FRESH, "vary": (), "has_validator": True, **changes})


@pytest.mark.parametrize("given, stale_held, usable, expected", [
    # A storable 200 is filled, whatever is stored.
    (answer(), False, False, Decision(Step.FILL)),
    (answer(), True, True, Decision(Step.FILL)),
    # 304 revalidates only what is held; without it, a 304 is one client's answer.
    (answer(status=304), True, False, Decision(Step.REVALIDATED)),
    (answer(status=304, policy=Policy(storable=False, reason="304 is not stored")), False, False,
     Decision(Step.PASS, "304 is not stored")),
    # 5xx serves the stale copy only when it may still be served on error (RFC 5861).
    (answer(status=503), True, True, Decision(Step.STALE_ON_ERROR)),
    (answer(status=503, policy=Policy(storable=False, reason="503")), True, False, Decision(Step.PASS, "503")),
    (answer(status=503, policy=Policy(storable=False, reason="503")), False, True, Decision(Step.PASS, "503")),
    # Reasons not to store, in order.
    (answer(policy=Policy(storable=False, reason="no-store")), False, False, Decision(Step.PASS, "no-store")),
    (answer(vary=None, vary_listed="*"), False, False,
     Decision(Step.PASS, "Vary: '*' names no field a request could match")),
    (answer(length=10, fits=False), False, False, Decision(Step.PASS, "10 bytes exceed capacity")),
    (answer(length=None, fits=False), False, False, Decision(Step.FILL)),  # unknown length: the fill finds out
    (answer(policy=Policy(storable=True, reason="ok", ttl=0.0), has_validator=False), False, False,
     Decision(Step.PASS, "it is stale at once and has no validator: it could never be reused")),
    (answer(policy=Policy(storable=True, reason="ok", ttl=0.0), has_validator=True), False, False,
     Decision(Step.FILL)),
    (answer(header_bytes=MAX_STORED_HEADER_BYTES + 1), False, False,
     Decision(Step.PASS, f"its header fields take {MAX_STORED_HEADER_BYTES + 1} bytes, more than the "
                         f"{MAX_STORED_HEADER_BYTES} this cache stores with an object")),
    (answer(header_bytes=MAX_STORED_HEADER_BYTES), False, False, Decision(Step.FILL)),
    # The first reason wins when several hold.
    (answer(policy=Policy(storable=False, reason="private"), vary=None, length=10, fits=False), False, False,
     Decision(Step.PASS, "private")),
])
def test_the_leader_takes_the_step_its_answer_calls_for(given, stale_held, usable, expected):
    assert decide(given, stale_held=stale_held, stale_usable_on_error=usable) == expected


@pytest.mark.parametrize("status, says_hit, expected", [
    (200, False, Step.FILL),  # a 200 from a peer is its stored copy (it refuses a fill with 404/504)
    (404, True, Step.FILL),  # a stored 404 is a copy too, when the peer served it from disk
    (404, False, Step.PEER_REFUSED),
    (504, False, Step.PEER_REFUSED),  # only-if-cached: the peer does not hold it
    (503, True, Step.PEER_REFUSED),  # never stored, whatever the peer says
])
def test_a_copy_from_a_peer_is_all_or_nothing(status, says_hit, expected):
    """A replica never falls back to the origin: a peer answer that is no stored copy fails the copy."""
    got = decide(answer(status=status, from_peer=True, peer_says_hit=says_hit), stale_held=False,
                 stale_usable_on_error=False)
    assert got.step is expected
