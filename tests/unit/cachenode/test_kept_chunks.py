"""An adopted chunk 0 a node owns none of is kept for the reads of its object here (cachenode/chunks/kept.py):
until the leading request has passed it and no other read is on its way to it, within a bound.

The bound is a minute where a test waits for a wake-up, and the test's own guard half of it: a copy
let go by its bound instead of by the reads would time the guard out, whatever the load."""

from __future__ import annotations

import asyncio
import time

from cachenode.chunks.kept import KeptChunks

CKEY = "http://h/x#chunk/1048576/0"


async def test_a_copy_kept_for_the_leading_request_waits_until_a_read_has_passed_chunk_0():
    kept = KeptChunks()
    held = kept.keep(CKEY, read_here=True)
    waiting = asyncio.ensure_future(kept.read(held, within=60))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "no read here has passed chunk 0 yet: the leading request has not come"
    reading = kept.reading(CKEY)  # the leading request, after its hand-off to the handler
    await asyncio.sleep(0.05)
    assert not waiting.done(), "the leading request has not passed chunk 0 yet"
    reading.done()
    assert await asyncio.wait_for(waiting, 30) is True


async def test_a_copy_waits_for_every_read_on_its_way_to_chunk_0_not_only_the_first():
    kept = KeptChunks()
    held = kept.keep(CKEY, read_here=True)
    first, second = kept.reading(CKEY), kept.reading(CKEY)
    waiting = asyncio.ensure_future(kept.read(held, within=60))
    first.done()
    first.done()  # idempotent: a read that passed chunk 0 and then ended counts once
    await asyncio.sleep(0.05)
    assert not waiting.done(), "a second read is still on its way to chunk 0"
    second.done()
    assert await asyncio.wait_for(waiting, 30) is True


async def test_a_copy_whose_fill_a_peer_led_waits_only_for_reads_under_way():
    kept = KeptChunks()
    held = kept.keep(CKEY, read_here=False)  # a peer's request: answered the manifest, reads nothing here
    assert await asyncio.wait_for(kept.read(held, within=60), 30) is True
    reading = kept.reading(CKEY)
    waiting = asyncio.ensure_future(kept.read(held, within=60))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "a client's read here is on its way to chunk 0"
    reading.done()
    assert await asyncio.wait_for(waiting, 30) is True


async def test_a_copy_is_never_kept_past_its_bound_when_no_read_comes():
    kept = KeptChunks()
    held = kept.keep(CKEY, read_here=True)
    started = time.monotonic()
    assert await asyncio.wait_for(kept.read(held, within=0.2), 30) is False
    assert time.monotonic() - started >= 0.2


async def test_a_released_copy_makes_later_reads_wait_for_nothing():
    kept = KeptChunks()
    held = kept.keep(CKEY, read_here=True)
    kept.release(held)
    later = kept.reading(CKEY)
    later.done()
    assert held.reading == 0 and not held.passed, "a read after the release is no read of the released copy"
    newer = kept.keep(CKEY, read_here=True)
    kept.release(held)  # an older keep's release leaves a newer keep of the same chunk alone
    kept.reading(CKEY)
    assert newer.reading == 1
