"""Why a peer cut its answer (cachenode/peers/cuts.py): the cuts a node notes, and the asker's verdict."""

from __future__ import annotations


from cachenode.peers.cuts import CUT_NOTED, Cuts, answer_cut, asked_why_cut
from nezha.errors import OriginError
from nezha.ring import Peer
from nezha.wire import CUT_HEADER, FILL_FAILED_HEADER

PEER = Peer("n1", "127.0.0.1:1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cut_is_remembered_for_cut_noted_seconds_and_only_for_its_key():
    clock = Clock()
    cuts = Cuts(clock)
    cuts.note("k1", "the origin died")
    assert cuts.why("k1") == "the origin died"
    assert cuts.why("k2") is None
    clock.now += CUT_NOTED
    assert cuts.why("k1") == "the origin died"
    clock.now += 0.1
    assert cuts.why("k1") is None


def test_noting_a_cut_forgets_the_ones_older_than_cut_noted():
    clock = Clock()
    cuts = Cuts(clock)
    cuts.note("old", "a")
    clock.now += CUT_NOTED + 1
    cuts.note("new", "b")
    assert set(cuts._cut) == {"new"}


def test_the_answer_names_the_failed_fill_or_says_nothing_was_cut():
    cuts = Cuts(Clock())
    assert answer_cut(cuts, "k").status == 404
    cuts.note("k", "origin   broke\noff")
    answered = answer_cut(cuts, "k")
    assert answered.status == 200 and answered.headers[FILL_FAILED_HEADER] == "origin broke off"


class Answer:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers, self.released = status, headers, False

    def release(self) -> None:
        self.released = True


class Asker:
    """Answers the question with `answer`, or raises it; records what was asked and who was marked down."""

    def __init__(self, answer: Answer | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, dict[str, str]]] = []
        self.down: list[tuple[str, str]] = []

    async def ask(self, peer, method, url, *, headers, after=None):
        self.asked.append((method, url, headers))
        self.after = after
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def mark_down(self, peer, why):
        self.down.append((peer.id, why))

    def is_down(self, peer):
        return any(who == peer.id for who, _ in self.down)


async def test_a_peer_that_says_its_fill_failed_is_not_marked_down():
    answer = Answer(200, {FILL_FAILED_HEADER: "origin died after 7 bytes"})
    asker = Asker(answer)
    failed = await asked_why_cut(asker, PEER, "http://n1/x", headers={"Host": "h"}, why="broke after 7 bytes")
    assert failed == "origin died after 7 bytes"
    assert asker.down == [] and answer.released
    assert asker.asked == [("GET", "http://n1/x", {"Host": "h", CUT_HEADER: "1"})]
    assert asker.after == "broke after 7 bytes", "the break is said first if the question marks it down"


async def test_a_peer_that_cut_nothing_or_does_not_answer_is_marked_down_with_the_break():
    for answer, reason in [(Answer(404, {}), "broke after 7 bytes"),
                           (Answer(200, {}), "broke after 7 bytes"),  # a 200 that says nothing of a failed fill
                           (Answer(503, {FILL_FAILED_HEADER: "x"}), "broke after 7 bytes"),
                           (OriginError("connection refused"),
                            "broke after 7 bytes; then did not answer: connection refused")]:
        asker = Asker(answer)
        assert await asked_why_cut(asker, PEER, "http://n1/x", headers={}, why="broke after 7 bytes") is None
        assert asker.down == [("n1", reason)], answer


async def test_a_peer_the_question_already_found_down_is_not_marked_twice():
    """`ask` marks a peer down itself when the question fails and so does its liveness probe."""
    asker = Asker(OriginError("connection refused; then its liveness probe failed"))
    asker.down.append(("n1", "marked by ask"))
    assert await asked_why_cut(asker, PEER, "http://n1/x", headers={}, why="broke after 7 bytes") is None
    assert asker.down == [("n1", "marked by ask")]
