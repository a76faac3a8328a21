"""A body whole in memory (a small fill stored at once) is checked against
its published digest before anything of it is written (`fill/verify.py`
`check_whole`): on the event loop up to INLINE bytes, beyond that on a
hashing thread, so a large body never holds the loop."""

from __future__ import annotations

import base64
import hashlib
import random
import threading

import pytest

from cachenode.fill.verify import INLINE, check_whole
from cachenode.http.digests import Verifier, expectations


def expected_for(body: bytes):
    return expectations({"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(body).digest()).decode()},
                        status=200).cheapest()


@pytest.mark.parametrize("size", [1, 20_000, INLINE, INLINE + 1, 3 * INLINE])
async def test_a_body_is_what_was_published_or_its_mismatch_names_both_digests(size):
    body = random.Random(size).randbytes(size)
    assert await check_whole(expected_for(body), body) is None
    wrong = bytes([body[0] ^ 1]) + body[1:]
    mismatch = await check_whole(expected_for(body), wrong)
    assert mismatch is not None and mismatch.length == size
    assert mismatch.expected.field == "x-amz-checksum-sha256" and mismatch.got != mismatch.expected.shown()


@pytest.mark.parametrize(("size", "on_loop"), [(INLINE, True), (INLINE + 1, False)])
async def test_a_body_up_to_inline_is_hashed_on_the_loop_and_a_larger_one_on_a_hashing_thread(
        size, on_loop, monkeypatch):
    threads: list[str] = []
    update = Verifier.update

    def noted(self, data):
        threads.append(threading.current_thread().name)
        return update(self, data)

    monkeypatch.setattr(Verifier, "update", noted)
    body = bytes(size)
    assert await check_whole(expected_for(body), body) is None
    if on_loop:
        assert threads == [threading.main_thread().name]
    else:
        assert threads and all(t.startswith("nezha-digest") for t in threads)
