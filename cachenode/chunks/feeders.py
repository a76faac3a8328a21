"""Which node a peer passing a chunk on reads it from: a chain (a tree)
of the nodes reading it at once, rooted at its owner. Pure: no I/O.

A node that does not own a chunk passes it on to its own readers through
one request (chunks/fills.py `ChunkFills.passing`). Asked of the chunk's
owner by every node at once, the owner's link carried the chunk once per
reading node, N − 1 times, and the node owning the most chunks first set a
stampede's time: (K/N + f·(N − 1))·S on its link, f its share of the
chunks, 0.375 on 8 nodes in the stampede benchmark (docs/benchmarks.md,
"Chunk stampedes: where the time goes"). So an owner sends a chunk to the
first node asking for it and sends each node asking while that answer
runs (a wave) to a node already reading it there, the earliest that feeds
fewer than `fanout` others: a chain for a fanout of 1, and every link
carries each chunk at most `fanout` times, whatever N is, as the copies
of a whole object do (cachenode/cluster/streaming.py `feeds_from`).

A wave is worth its depth only where the first owners' links are uneven.
When every node leads about its even share of the object's chunks
(`nezha/chunks.py` `place` bounds the leads at ceil(C / N)), an owner
sending its chunks to every asker itself (a star) already spreads the
passes evenly: each link sends its ceil(C / N) chunks N − 1 times, the
even share when N divides C, and each chunk is one hop from every node, so
no node's clients wait on a hop two nodes away. Chains put the passes
where the asking order falls instead: in a stampede at N = 8 with 8 chunks,
the nodes that asked first stood early in every chain and sent 9 to 11
chunks where 7 is even, and a hop out of such a link crawled with every
node behind it waiting (docs/benchmarks.md, "Chunk stampedes: a star where
the leads are even"). So an owner keeps its waves for objects whose leads
cannot be even (fewer chunks than nodes, or a remainder that leaves the
busiest lead more than STAR_SLACK over the even share: `star`).

A node sent on is asked with the chunk spec's role "fed" and answers from
its own flight of the chunk, a pass or a fill, as it grows; when it has
none any more it says so, and the asker asks the owner again, this time
to be answered (role "pass-direct"). A node is placed in a wave once: its
second ask within one wave is answered by the owner, so no two nodes ever
wait on each other's flight. A wave ends when the last answer the owner
sends of the chunk ends; the next asker starts a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The roles of a chunk request (`ChunkSpec.role`). "fill": an owner's fill
# copying the chunk (kept); "pass": a non-owner passing it on, which may be
# sent to a node of the wave; "pass-direct": a pass whose node of the wave
# could not feed it, answered by the owner; "fed": asked of a node of the
# wave, answered from its flight of the chunk or not at all. None: a reader's
# own request (a piece, a resumed rest), answered and never a node of a wave.
ROLES = ("fill", "pass", "pass-direct", "fed")
FEEDS = frozenset({"fill", "pass", "pass-direct"})  # whoever asks with these reads the whole chunk in one flight

# Ring sizes up to which a wave is a chain (one feed per node); a tree of
# degree 2 beyond, as a whole object's copies (cluster/streaming.py CHAIN_NODES).
CHAIN_NODES = 16


# How far over the even share of passes (C·(N − 1)/N chunks) a star may load its busiest link.
STAR_SLACK = 1.25


def star(chunks: int, nodes: int) -> bool:
    """Whether the owners of an object of `chunks` chunks in a ring of
    `nodes` answer every node passing a chunk on themselves (no wave): when
    the bounded leads, ceil(chunks / nodes) each at most, keep the busiest
    owner's passes within STAR_SLACK of the even share."""
    if nodes <= 1 or chunks <= 0:
        return True
    return -(-chunks // nodes) * nodes <= STAR_SLACK * chunks


def fanout_for(nodes: int) -> int:
    """How many other nodes one node of a wave feeds in a ring of `nodes`."""
    return 1 if nodes <= CHAIN_NODES else 2


@dataclass
class _Wave:
    fed: dict[str, int] = field(default_factory=dict)  # node -> nodes it feeds, in the order they came
    open: int = 0  # answers of the chunk this node is sending now


class Feeders:
    """This node's waves, one per chunk key it is sending now."""

    def __init__(self) -> None:
        self._waves: dict[str, _Wave] = {}

    def feeder_for(self, ckey: str, asker: str, *, fanout: int) -> str | None:
        """The node `asker`, passing chunk `ckey` on, should read it from
        instead of this node; None: from this node (no wave runs, every node
        of it feeds `fanout` already, or `asker` is in it already)."""
        wave = self._waves.get(ckey)
        if wave is None or asker in wave.fed:
            return None
        for node, fed in wave.fed.items():  # the earliest first: a chain for 1, a heap for more
            if fed < fanout:
                wave.fed[node] = fed + 1
                wave.fed[asker] = 0
                return node
        return None

    def sending(self, ckey: str, asker: str) -> None:
        """This node starts sending chunk `ckey` to `asker`, which reads it
        whole in one flight: `asker` can feed the nodes that ask next."""
        wave = self._waves.setdefault(ckey, _Wave())
        wave.fed.setdefault(asker, 0)
        wave.open += 1

    def sent(self, ckey: str) -> None:
        """One answer `sending` counted ended; the wave with its last."""
        wave = self._waves.get(ckey)
        if wave is None:
            return
        wave.open -= 1
        if wave.open <= 0:
            del self._waves[ckey]

    def running(self, ckey: str) -> list[str]:
        """The nodes of `ckey`'s wave, in the order they came (for logs and tests)."""
        wave = self._waves.get(ckey)
        return list(wave.fed) if wave is not None else []
