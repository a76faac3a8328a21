"""The exception tree of every Nezha component, drawn in one place.

Errors raised on purpose derive from NezhaError; a few signals that code
catches next to the standard library's own (a socket that failed, a bad
value) derive from those instead. Each line: the class, where it is
defined, what it means. tests/unit/nezha/test_errors_tree.py checks that
the drawing is the tree the code defines.

    Exception  builtins
    ├── NezhaError  nezha.errors: base of every error Nezha raises on purpose
    │   ├── ConfigError  nezha.errors: settings that cannot work together; named fields (exit 2)
    │   │   └── RuleError  webhook.rules: a webhook rule that cannot work
    │   ├── RunError  nezha.errors: a run-time failure a user can act on, such as a port in use (exit 1)
    │   ├── OriginError  nezha.errors: the origin could not be reached or answered badly
    │   │   └── OriginTimeout  nezha.errors: the origin did not answer in time
    │   │       ├── PoolBusy  nezha.errors: no connection of this node's own pool came free in time
    │   │       ├── PeerSilent  cachenode.peers.asks: a peer took the connection, then stopped answering
    │   │       └── PeerLate  cachenode.peers.asks: a peer passed its probes but sent no headers in time
    │   ├── FillAborted  nezha.errors: a fill stopped before the object was complete
    │   │   ├── LeaderGone  cachenode.fill.engine: the request leading a flight ended before the origin answered
    │   │   │   └── PeerSourceFailed  cachenode.fill.engine: a copy from a peer failed; who joined it asks the origin
    │   │   ├── ChunkChanged  cachenode.chunks.spec: a chunk's origin answer is not of its manifest's version
    │   │   └── DigestMismatch  cachenode.fill.verify: the bytes differ from the digest the origin published
    │   ├── ChunkUnavailable  cachenode.chunks.spec: no owner of a chunk, nor the origin, could send it
    │   ├── StoreError  nezha.errors: the disk store failed at a named step
    │   │   └── CorruptCopy  cachenode.store.disk: a peer's copy whose bytes are not its sender's checksums
    │   ├── NotStored  cachenode.store.objects: a fill's bytes reached its clients whole but were not stored
    │   │   ├── TooLarge  cachenode.store.objects: larger than the store's capacity
    │   │   ├── Refused  cachenode.store.objects: the eviction policy kept what is stored over this newcomer
    │   │   ├── PartialDropped  cachenode.fill.unstored: an on-demand fill nobody asked more of
    │   │   ├── Superseded  cachenode.fill.unstored: a write to the URL succeeded while it filled
    │   │   ├── Unprovable  cachenode.fill.unstored: a body that ended at a close, with nothing proving it whole
    │   │   └── StoreUnwritable  cachenode.fill.unstored: the disk refused the body (ENOSPC, EIO, ...)
    │   ├── RangesAbandoned  cachenode.fill.buffer: a parallel range fetch gave up; the fill goes on as one stream
    │   ├── BadTarget  nezha.keys: a request line or Host that names no object (400)
    │   │   └── BadHost  nezha.keys: a host no origin can have, an IP literal (403)
    │   ├── IndexUnavailable  nezha.index.connection: Redis did not answer a call that needed it
    │   ├── Deposed  nezha.index.membership: a ring write by a controller that no longer leads
    │   ├── AnnotationError  nezha.errors: an invalid nezha.io/* annotation (controller)
    │   │   └── AnnotationError  controller.annotations: the same, naming the annotation and its value
    │   ├── ExpandFailed  controller.expand: a prefetch name whose listing could not be read
    │   │   └── NotAnOrigin  controller.expand: a prefetch name that expands to a host outside the origin table
    │   ├── SecretUnreadable  controller.sources: a workload's prefetch Secret that cannot be read or used
    │   ├── ReviewError  nezha.errors: a malformed AdmissionReview (webhook)
    │   ├── PatchError  webhook.ops: an object whose shape is no pod spec the webhook understands
    │   │   └── TooManyContainers  webhook.ops: env mode declines a pod with too many containers
    │   ├── DrainFailed  nezha.dev.local_cluster: a node's objects did not all reach their new owners
    │   ├── NodeFailed  nezha.dev.local_cluster: a local node that did not come up, or died
    │   └── RingTaken  nezha.dev.local_cluster: the index holds a ring `nezha up` did not write
    ├── BrokenStream  cachenode.kernel.splice: a body could not be completed; the connection was closed
    └── NotAllowed  cachenode.tls.certificates: a certificate asked for a name that is no origin

    ConnectionError  builtins
    ├── ClientGone  cachenode.kernel.splice: the client closed its connection mid-body (relay, sendfile)
    └── SendCut  cachenode.kernel.sendfile: the client's socket failed during a sendfile

    OSError  builtins
    └── FileWriteFailed  cachenode.kernel.splice: the file side of a pump failed, at a known offset

    ValueError  builtins
    ├── BadRedisURL  nezha.redis_url: a --redis-url of no known form
    ├── BadName  nezha.prefetch.names: a nezha.io/prefetch entry that names nothing to expand
    ├── BadListing  nezha.prefetch.listings: an answer that is not the listing it should be
    ├── InvalidField  cachenode.http.targeted: a targeted cache-control field that is no Structured Field Dictionary
    ├── NotClientHello  cachenode.tls.hello: bytes on port 443 that are no TLS ClientHello
    ├── BadBlocks  cachenode.store.blocks: stored bytes that are not the ones their block checksums name
    ├── Unsealed  cachenode.store.sealed: a small object's file that is not whole (short, torn, damaged)
    ├── BrokenFrame  cachenode.cluster.replica_frames: a replica batch's record head that is not one; the rest is lost
    └── Damaged  cachenode.cluster.replica_frames: a replica batch's record whose bytes fail its checksum

Messages say what failed, for which key or object, and the value seen.
"""


class NezhaError(Exception):
    """Base of every error Nezha raises on purpose."""


class ConfigError(NezhaError):
    """Bad settings: the command exits 2 before it binds or writes anything."""


class RunError(NezhaError):
    """A failure at run time the user can act on (a port in use): one line, exit 1, no traceback."""


class OriginError(NezhaError):
    pass


class OriginTimeout(OriginError):
    pass


class PoolBusy(OriginTimeout):
    """No connection of this node's own client pool came free in time: nothing was asked of the far end,
    so nothing is known of it (a peer is not marked down for it)."""


class FillAborted(NezhaError):
    pass


class StoreError(NezhaError):
    pass


class AnnotationError(NezhaError):
    pass


class ReviewError(NezhaError):
    pass
