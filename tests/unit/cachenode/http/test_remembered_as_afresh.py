"""Every reading the http rules remember (per set of names, per name as
asked, per names and Connection, per Cache-Control, targeted, Vary value
and date) reads a message as it reads it with nothing remembered, past each
memo's bound too: more sets of names than `_NAMES_KEPT`, more names asked of
one set than `_ASKED_KEPT`, more Connection values with one set's names than
`_DERIVED_KEPT`. The recorded table (fill/test_judged_as_before.py) meets
none of these bounds and asks by the rules' own spellings only."""

import random

from cachenode.http import fields, freshness, headers, targeted, vary
from cachenode.http.digests import expectations
from cachenode.http.fields import FieldLines, field_value
from cachenode.http.freshness import response_directives, response_policy
from cachenode.http.headers import connection_listed, end_to_end_pairs, stored_pairs
from cachenode.http.vary import vary_names

NAMES = ["Server", "Date", "Connection", "X-Hop", "Cache-Control", "Vary", "Keep-Alive", "Proxy-Thing", "ETag",
         "Last-Modified", "Age", "Set-Cookie", "CDN-Cache-Control", "Content-MD5", "x-amz-checksum-crc32",
         "X-Nezha-Cache", "Content-Length", "Expires", "Te"]
VALUES = {"connection": ["close", "keep-alive", "close, X-Hop", "x-hop, server", "", "ETag , Vary", "Cache-Control"],
          "cache-control": ["max-age=60", "no-store", 'private="a, b", max-age=9', "Max-Age=5, s-maxage=1", " , "],
          "vary": ["*", "Accept-Encoding", "accept , ,Origin", "a b", ""],
          "cdn-cache-control": ["max-age=600", "not;;", "max-age=1.5", "no-store"],
          "last-modified": ["Sun, 29 Nov 2026 02:58:40 GMT", "Sun Nov  1 02:58:40 2026", "Mon, 30 Feb 2026 00:00:00 GMT"],
          "age": ["100", "7, 9", "soon"], "content-md5": ["XUFAKrxLKna5cZ2REBfFkg==", "not base64"]}
NOW = 1_795_836_011.5


def cased(rng: random.Random, name: str) -> str:
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name)


def messages(seed: int, count: int) -> list[list[tuple[str, str]]]:
    """Messages of recurring and ever new sets of names (any case), their values drawn anew each time."""
    rng = random.Random(seed)
    recurring = [rng.sample(NAMES, rng.randint(1, 9)) for _ in range(8)]
    out = []
    for _ in range(count):
        names = rng.choice(recurring) if rng.random() < 0.5 else [cased(rng, n) for n in rng.sample(NAMES, rng.randint(1, 9))]
        pairs = [(n, rng.choice(VALUES.get(n.lower(), ["1", "x", ""]))) for n in names]
        if rng.random() < 0.3:  # a Connection of its own, listing a name in any case
            pairs = [(n, f"{cased(rng, rng.choice(NAMES))}, {rng.randint(0, 99)}" if n.lower() == "connection" else v)
                     for n, v in pairs]
        out.append(pairs)
    return out


def readings(pairs: list[tuple[str, str]], asked: list[str]) -> list:
    lines = FieldLines(pairs)
    return [[(field_value(lines, a), lines.lines(a), a in lines, lines.get(a)) for a in asked], lines.by_name(),
            stored_pairs(lines), end_to_end_pairs(lines, drop=frozenset({"etag"})), connection_listed(lines),
            vary_names(lines), expectations(lines, status=200), response_directives(lines, ("CDN-Cache-Control",)),
            response_policy(200, lines, now=NOW, policy_ttl=None),
            response_policy(200, lines, now=NOW, policy_ttl=None, targeted=("CDN-Cache-Control",))]


def forget_everything() -> None:
    fields._NAMES.clear()
    fields._DIRECTIVES.clear()
    targeted._directives.clear()
    fields.http_date.cache_clear()
    freshness._lists_star.cache_clear()
    vary._names_listed.cache_clear()
    headers._listed.cache_clear()


def warm_and_cold(sent: list[list[tuple[str, str]]], asked: list[list[str]]) -> None:
    """Each message read in turn with all read before it remembered, and
    again with nothing remembered: the same, message by message."""
    forget_everything()
    remembered = [readings(pairs, names) for pairs, names in zip(sent, asked)]
    for pairs, names, warm in zip(sent, asked, remembered):
        forget_everything()
        assert warm == readings(pairs, names), (pairs, names)


def test_what_is_remembered_reads_as_what_is_read_afresh_past_every_bound():
    rng = random.Random(35)
    sent = messages(35, 3 * fields._NAMES_KEPT)
    asked = [[cased(rng, rng.choice(NAMES + ["Nowhere"])) for _ in range(6)] for _ in sent]
    assert len({tuple(n for n, _ in pairs) for pairs in sent}) > fields._NAMES_KEPT
    warm_and_cold(sent, asked)


def test_one_set_of_names_asked_and_connected_past_its_bounds():
    """One origin's names: asked in ever new spellings, with ever new Connection values."""
    names = ["Server", "Connection", "X-Hop", "Cache-Control", "Vary"]
    rng = random.Random(9)
    count = 4 * max(fields._ASKED_KEPT, fields._DERIVED_KEPT)
    sent = [list(zip(names, ["s", f"{cased(rng, rng.choice(['x-hop', 'server', 'vary', 'none']))}, t{i}", "1",
                             f"max-age={i}", rng.choice(["Accept", "*", "a b"])])) for i in range(count)]
    asked = [[cased(rng, rng.choice(names + ["Nowhere"])) for _ in range(3)] for _ in sent]
    assert len({a for names_asked in asked for a in names_asked}) > fields._ASKED_KEPT
    warm_and_cold(sent, asked)


def test_long_names_and_connection_values_are_read_and_never_kept():
    """What an origin's ever new long names or Connection values would make the node keep is bounded
    by length too, not only by count: such messages read as any other and nothing of them stays."""
    forget_everything()
    rng = random.Random(3)
    for i in range(40):
        long_name = f"X-{i}-" + "n" * fields._NAMES_LENGTH_MAX
        connection = f"x-hop, {i}-" + "c" * fields._ARG_KEPT_MAX
        pairs = [("Server", "s"), (long_name, "v"), ("Connection", connection), ("X-Hop", "1"), ("ETag", '"e"')]
        asked = [cased(rng, n) for n in ("Server", long_name, "X-Hop", "Nowhere")]
        warm = readings(pairs, asked)
        assert not any(len(name) > 1000 for names in fields._NAMES for name in names)
        short = [("Server", "s"), ("Connection", connection), ("X-Hop", "1")]
        assert readings(short, ["x-hop"]) == readings(short, ["x-hop"])
        held = fields._NAMES.get(("Server", "Connection", "X-Hop"))
        assert held is not None and not any(connection in key for key in held.derived)
        forget_everything()
        assert warm == readings(pairs, asked)
