"""A fill's bytes checked against the digest its source published, while
the fill runs (issue 37; docs/cache-node.md, "Verified bytes").

What a digest is and how it is computed is `cachenode/http/digests.py`;
this is where a fill's bytes meet it. Most fills never hold their bytes:
the kernel splices them socket -> pipe -> temp file, and a parallel fill
lands its ranges out of order. So the check follows the temp file's
contiguous prefix (every fill reports it, whichever way its bytes come)
and hashes each new stretch in a thread, from the page cache the fill has
just written (store/writeback.py keeps those pages): the disk is not read
again, the event loop hashes nothing, and at the fill's end only the last
stretch is left to hash. Until the check has passed, a fill's readers
are kept from the body's last byte (`Fill._available`), so a client
never gets a clean end of wrong bytes: on a mismatch its connection is
cut, nothing is stored, and the next request fetches again.
"""

from __future__ import annotations

import asyncio
import mmap
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Iterable, Mapping

import structlog
from yarl import URL

from cachenode.http.digests import Expectations, Expected, Mismatch, Verifier, expectations, of_the_whole_in_a_part
from nezha.errors import FillAborted
from nezha.keys import Target

if TYPE_CHECKING:
    from prometheus_client import Counter

log = structlog.get_logger("nezha.fill")

# Hashing runs here, off the event loop; hashlib and awscrt release the GIL
# over large buffers, so two fills hash on two cores.
_HASHERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nezha-digest")
# A stretch is hashed once this many new bytes are on disk: 128 thread hops
# (and GIL hand-overs) per GiB, and at most about this much left to hash
# when the last byte lands, which the clients wait for.
STEP = 8 << 20
# What is left to hash at the end up to this size is hashed on the event loop
# (sha256 of 256 KiB: about 0.15 ms here), not in a thread: a small object's
# clients wait for its check, and a thread hop costs about as much.
INLINE = 256 << 10
# mmap's flags: shared pages of the file, faulted in by the mmap call itself.
_MAP = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class DigestMismatch(FillAborted):
    """The bytes a source sent are not the ones its published digest names:
    nothing is stored, and every client of the fill is cut before the end."""

    def __init__(self, message: str, *, mismatch: Mismatch) -> None:
        super().__init__(message)
        self.mismatch = mismatch


class BodyCheck:
    """Hashes a growing temp file's prefix behind its fill, one stretch at a time."""

    def __init__(self, verifier: Verifier, *, fd: int, step: int = STEP) -> None:
        self.verifier = verifier
        self._fd = os.dup(fd)  # the fill may close its own descriptor while a stretch is hashed
        self._step = step
        self._hashed = 0  # bytes [0, _hashed) are in the verifier
        self._job: asyncio.Future | None = None
        self._closing = False
        # A stretch that could not be hashed (the mapping failed): the
        # verifier may hold part of it, so no later result can be trusted.
        self._broken: BaseException | None = None

    @property
    def field(self) -> str:
        return self.verifier.expected.field

    def grew(self, prefix: int) -> None:
        """Bytes [0, prefix) are in the file: hash a stretch if one is due and none is being hashed."""
        if self._job is None and not self._closing and self._broken is None and prefix - self._hashed >= self._step:
            self._start(prefix)

    def _start(self, end: int) -> asyncio.Future:
        job = asyncio.get_running_loop().run_in_executor(_HASHERS, self._hash, self._hashed, end)
        self._job = job
        job.add_done_callback(self._done)
        return job

    def _done(self, job: asyncio.Future) -> None:
        self._job = None
        if job.cancelled():
            self._broken = asyncio.CancelledError()
        elif job.exception() is not None:
            self._broken = job.exception()
        else:
            self._hashed = job.result()
        if self._closing:
            self._close_fd()

    def _hash(self, start: int, end: int) -> int:
        """Hash bytes [start, end) where they lie in the page cache: mapped,
        not copied, and in one call, which takes the GIL back once. Beside
        a thread holding the GIL, sha256 of 256 MiB from the page cache
        here (2 loaded vCPUs) ran at 161 MB/s as a loop of 1 MiB preads,
        276 MB/s as mapped 2 MiB stretches and 326 MB/s in one mapping."""
        base = start - start % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(self._fd, end - base, flags=_MAP, prot=mmap.PROT_READ, offset=base) as mapped:
            with memoryview(mapped) as whole, whole[start - base:] as stretch:
                self.verifier.update(stretch)
        return end

    async def finish(self, total: int) -> Mismatch | None:
        """Hash what is left up to `total` bytes (the whole body) and compare.

        Raises FillAborted when a stretch could not be hashed: the bytes are
        then unchecked, not wrong, and are not stored either."""
        while self._job is not None:
            await asyncio.wait([self._job])
        if self._broken is None and 0 < total - self._hashed <= INLINE:
            try:
                self._hashed = self._hash(self._hashed, total)
            except (OSError, ValueError) as e:
                self._broken = e
        elif self._broken is None and self._hashed < total:
            await asyncio.wait([self._start(total)])
        if self._broken is not None:
            raise FillAborted(f"hashing the body for its {self.field} failed: "
                              f"{type(self._broken).__name__}: {self._broken}") from self._broken
        return self.verifier.mismatch()

    def close(self) -> None:
        """The fill ended: the descriptor goes, once no stretch is being hashed on it."""
        self._closing = True
        if self._job is None:
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


async def check_whole(expected: Expected, body: bytes) -> Mismatch | None:
    """`body`, whole in memory, against `expected`: None when it is what was
    published. Hashed on the event loop up to INLINE bytes, beyond that on a
    hashing thread, as `BodyCheck` hashes what is left of a file."""
    verifier = Verifier(expected)
    if len(body) <= INLINE:
        verifier.update(body)
    else:
        await asyncio.get_running_loop().run_in_executor(_HASHERS, verifier.update, body)
    return verifier.mismatch()


# Redirect targets whose X-Linked-ETag is remembered, most recent last.
LINKED_KEPT = 4096


class Digests:
    """The fill engine's side of checking: which digest an answer's body is
    checked against, the Hugging Face digests its redirects announced, and
    what a mismatch leaves behind (a log line, a count)."""

    def __init__(self, *, mismatches: "Counter", origins: Iterable[str] = ()) -> None:
        self._mismatches = mismatches  # nezha_digest_mismatches_total{origin}
        for host in origins:  # a 0 for each named origin, so a rate() has a series from the start
            mismatches.labels(origin=host)
        # Hugging Face names an LFS file's sha256 (X-Linked-ETag) on the
        # answer that redirects to its bytes: by the target's host and path
        # (its query is a signature that differs on every redirect).
        self._linked: OrderedDict[tuple[str, str], str] = OrderedDict()

    def noted(self, asked: Target, status: int, headers: Mapping[str, str]) -> None:
        """Remember a redirect's X-Linked-ETag for the fill of the target it sends its client to."""
        if not 300 <= status < 400:
            return  # most answers: no field of theirs is read
        linked, location = headers.get("X-Linked-ETag"), headers.get("Location")
        if linked is None or location is None:
            return
        try:
            there = URL(f"{asked.scheme}://{asked.host}{asked.path}", encoded=True).join(URL(location))
        except ValueError:
            return
        target = ((there.host or "").lower(), there.raw_path)
        self._linked[target] = linked
        self._linked.move_to_end(target)
        while len(self._linked) > LINKED_KEPT:
            self._linked.popitem(last=False)

    def has_linked(self, host: str, path: str) -> bool:
        """Whether a redirect named a digest for the target at `host` `path` (`noted`)."""
        return (host.lower(), path) in self._linked

    def linked(self, target: Target) -> Expected | None:
        """The sha256 a redirect this node fetched or relayed named for `target`
        (kept for the fill of it here): what a relay hands the target's owner
        (nezha/wire.py DIGEST_HEADER), whose fill then checks it."""
        linked = self._linked.get((target.host.lower(), target.path))
        return None if linked is None else expectations((), status=200, linked_etag=linked).cheapest()

    def check(self, *, key: str, target: Target, status: int, headers: Mapping[str, str],
              fd: int, part: bool = False, handed: Expected | None = None) -> BodyCheck | None:
        """The check a fill of `target` runs over the body of its answer
        (`status`, `headers`; its file read through `fd`), or None when
        nothing published of it can be checked.

        `part`: the answer is a resume's 206 and the fill fetches the rest of
        the object around it, so the whole is checked against what names the
        whole: its Repr-Digest (`of_the_whole_in_a_part`). `handed`: the
        digest a peer's request handed on (a relay's resume, nezha/wire.py
        DIGEST_HEADER), of the same version (the 206 answered its If-Range)."""
        expected = self.expected(key=key, target=target, status=status, headers=headers, part=part, handed=handed)
        if expected is None or fd < 0:
            return None
        return BodyCheck(Verifier(expected), fd=fd)

    def expected(self, *, key: str, target: Target, status: int, headers: Mapping[str, str], part: bool = False,
                 handed: Expected | None = None) -> Expected | None:
        """The digest a fill of `target` checks its answer's body against (as
        `check`), or None when nothing published of it can be checked: for a
        body whole in memory, which is checked before it is written."""
        linked = self._linked.pop((target.host.lower(), target.path), None) if self._linked else None
        known = of_the_whole_in_a_part(headers) if part else \
            expectations(headers, status=status, linked_etag=linked)
        for ignored in known.ignored:
            log.info("digest_not_checked", key=key, field=ignored.field, reason=ignored.reason)
        if handed is not None:
            known = Expectations((*known.expected, handed), known.ignored)
        return known.cheapest()

    def mismatched(self, error: DigestMismatch, *, origin: str, key: str, source: str) -> None:
        m = error.mismatch
        log.error("digest_mismatch", origin=origin, key=key, source=source, field=m.expected.field,
                  expected=m.expected.shown(), got=m.got, bytes=m.length)
        self._mismatches.labels(origin=origin).inc()

