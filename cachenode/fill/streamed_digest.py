"""A body's bytes checked against a whole-object digest as they stream past
in order, hashed behind the stream: a relayed body across its resumes
(front/relay_body.py) and a chunked object assembled for a client
(chunks/whole.py). docs/cache-node.md, "Verified bytes".

What a digest is, and which one is checked, is `http/digests.py`'s. This
is only where streamed bytes meet it without slowing the stream down: a
crc64nvme or crc32c (about 17 GB/s on one core here) is computed on the
event loop as each chunk passes, since a thread hop would cost more than
the hash; anything slower (sha256 at about 1.7 GB/s, on every chunk a
large share of the loop's time) is hashed in a thread, in batches of at
least `STEP` bytes, one batch at a time and in order, while the loop goes
on sending the next chunks. The stream waits for the last batch only at
the body's end, before its last byte (`mismatch`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from cachenode.http.digests import Algorithm, Mismatch, Verifier

# hashlib releases the GIL over buffers this size: two relays hash on two cores.
_HASHERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nezha-stream-digest")
# Fast enough to hash on the event loop as the bytes pass.
ON_THE_LOOP = frozenset({Algorithm.CRC64NVME, Algorithm.CRC32C})
# A batch goes to the thread once this many bytes wait: a hop per MiB.
STEP = 1 << 20
# The stream waits for the thread when this many bytes wait behind a batch
# still being hashed: the bytes held in memory stay bounded.
MOST = 8 << 20
# What is left at the end up to this size is hashed on the loop: a hop costs as much.
INLINE = 256 << 10


class StreamedDigest:
    """One body's check, fed its bytes in order (a relayed one across every resume)."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier
        self._on_loop = verifier.expected.algorithm in ON_THE_LOOP
        self._batch: list[bytes] = []
        self._batched = 0
        self._job: asyncio.Future | None = None

    async def feed(self, chunk: bytes) -> None:
        if self._on_loop:
            self.verifier.update(chunk)
            return
        self._batch.append(chunk)
        self._batched += len(chunk)
        if self._job is not None and (self._job.done() or self._batched >= MOST):
            job, self._job = self._job, None
            await job
        if self._job is None and self._batched >= STEP:
            self._job = asyncio.get_running_loop().run_in_executor(_HASHERS, self._hash, self._take())

    def _take(self) -> list[bytes]:
        batch, self._batch, self._batched = self._batch, [], 0
        return batch

    def _hash(self, batch: list[bytes]) -> None:
        for chunk in batch:
            self.verifier.update(chunk)

    async def mismatch(self) -> Mismatch | None:
        """Once every byte fed is hashed: None when they are what the head
        published, else both digests."""
        if self._job is not None:
            job, self._job = self._job, None
            await job
        if self._batched > INLINE:
            await asyncio.get_running_loop().run_in_executor(_HASHERS, self._hash, self._take())
        elif self._batch:
            self._hash(self._take())
        return self.verifier.mismatch()
