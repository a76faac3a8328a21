"""What the fast path's hit lookup resolves a plain request to
(`PlainHitFinder.named`): the same as front/names.py `resolve` says, memoised,
and None exactly where the fast path neither serves a hit nor leads a miss."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachenode.front.hits import PlainHitFinder
from cachenode.front import hits
from cachenode.front.names import resolve
from cachenode.store.disk import Store
from nezha.origins import Origin, OriginTable

TABLE = OriginTable([Origin(host="data.example", upstream="http://127.0.0.1:9"),
                     Origin(host="*.bucket.example", upstream="http://127.0.0.1:9"),
                     Origin(host="private.example", upstream="http://127.0.0.1:9", credentials="authorize")])


@pytest.fixture
def finder(tmp_path: Path) -> PlainHitFinder:
    return PlainHitFinder(table=TABLE, store=Store(tmp_path), via="1.1 test", node_id="n1")


@pytest.mark.parametrize("target, host, scheme", [
    ("/d/000/1.bin", "data.example", "http"),
    ("/d/000/1.bin?x=1", "data.example:8080", "http"),
    ("/d/1.bin", "b1.bucket.example", "https"),
    ("http://b2.bucket.example/d/2.bin", "data.example.", "http"),  # an absolute URI's host wins over Host
])
def test_a_plain_request_is_named_as_resolve_names_it(finder, target, host, scheme):
    assert finder.named(target, host, scheme) == resolve(TABLE, target, host, scheme=scheme)


@pytest.mark.parametrize("target, host", [
    ("/d/1.bin", "elsewhere.example"),  # a Host naming no origin: the node's own
    ("http://data.example/d/1.bin", "elsewhere.example"),  # a Host naming no origin, whatever the URI names
    ("/d/1.bin", "private.example"),  # an authorize origin: each read is the origin's to allow
    ("not a target", "data.example"),  # a target that does not parse
])
def test_nothing_is_named_where_the_fast_path_neither_serves_nor_leads(finder, target, host):
    assert finder.named(target, host, "http") is None


def test_a_request_named_once_is_not_resolved_again(finder, monkeypatch):
    first = finder.named("/d/3.bin", "data.example", "http")
    monkeypatch.setattr(hits, "resolve", lambda *a, **k: pytest.fail("resolved a second time"))
    assert finder.named("/d/3.bin", "data.example", "http") is first
    assert finder.plain_hit(first) is None  # not stored: a miss


def test_a_host_is_judged_once_and_the_hosts_kept_are_bounded(finder, monkeypatch):
    """Whether a Host field names an origin is remembered, with its answer either way, and no more than
    _PLAIN_CACHE of them: the client chooses the field."""
    assert finder.named("/d/1.bin", "elsewhere.example", "http") is None
    monkeypatch.setattr(hits, "names_origin", lambda *a: pytest.fail("judged a second time"))
    assert finder.named("/d/2.bin", "elsewhere.example", "http") is None
    monkeypatch.undo()
    assert finder.named("/d/1.bin", "data.example", "http") == resolve(TABLE, "/d/1.bin", "data.example")
    for n in range(hits._PLAIN_CACHE + 10):
        assert finder.named("/d/1.bin", f"h{n}.example", "http") is None
    assert len(finder._hosts) <= hits._PLAIN_CACHE
