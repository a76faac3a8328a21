"""When a request that finds a fill is a later request, not its joiner (cachenode/front/reads.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cachenode.front.reads import arrived_whole


@pytest.mark.parametrize("complete, length, written, whole", [
    # Every byte of a known length is in: its client may have had its last byte already.
    (False, 100, 100, True),
    (True, 100, 100, True),
    # Bytes still to come: a request now joins the stream.
    (False, 100, 99, False),
    (False, 100, 0, False),
    # No length: only the end of the origin's body says it is whole.
    (False, None, 100, False),
    (True, None, 100, True),
])
def test_a_fill_is_whole_once_every_byte_of_its_length_is_in_before_its_body_has_ended(
        complete, length, written, whole):
    fill = SimpleNamespace(complete=complete, length=length, written=written)
    assert arrived_whole(fill) is whole
