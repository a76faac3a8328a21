"""A plain target's shortcut in `parse_target` (nezha/keys.py `_PLAIN_TARGET`)
reads every target as the full reading (`_parse_any`) does: the same Target,
so the same key, or the same refusal."""

from __future__ import annotations

import itertools
import random

import pytest

from nezha import keys
from nezha.keys import BadTarget, key_for, parse_target
from nezha.origins import Origin

PIECES = ["/", "a", "Z", "0", "d", "-", "_", "~", ".", "..", "/.", "/..", "%2e", "%2E", "%2f", "%5c", "%", "%zz",
          "\\", "?", "??", "=", "&", "#", "#x", " ", "\t", "\x00", "\x7f", "é", "\udcff", "+", "!", ";", ":", "@",
          "*", "'", "(", ")", ",", "$", "[", "]", "|", "^", "`", "{", "}", '"', "<", ">", "\u2028", "%20"]
HOSTS = ["data.example", "DATA.Example.:8080", "data.example.", "data.example:80", None, "", "bad_host!",
         "[::1]:80", " data.example ", "xn--d-a.example", "a", "a."]
EDGES = ["/", "/d/0/1.bin", "/d/0/1.bin?", "/d/0/1.bin?a=1&b=2", "/d/0/1.bin?a=1?b#c", "/d/0/1.bin#frag",
         "/.hidden/x", "/a/.b", "/a/..b", "/a/b.", "/a/b..", "/a/./b", "/a/../b", "/a/.", "/a/..", "/./", "//a//b",
         "/A/B~c_d-e.F", "/a%2Fb", "/a/%2e%2e/b", "/a/..%5cb", "/a\\..\\b", "/a?x=/../y", "/a?q=%zz", "/a?é=1",
         "/é", "/a b", "/a\x01", "/a?b c", "/a?b\x7f", "http://data.example/d/1.bin", "HTTP://Data.Example./x?y",
         "https://data.example", "ftp://data.example/x", "*", "", "d/1.bin", "?a=1"]


def reading(read, raw, host):
    """A Target, or the refusal's type and message."""
    try:
        return read(raw, host, scheme="http")
    except BadTarget as e:
        return type(e), str(e)


def targets():
    rng = random.Random(35)
    made = list(EDGES)
    made += ["/" + "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 8))) for _ in range(3000)]
    made += ["/d/" + "".join(rng.choice(PIECES[:9]) for _ in range(rng.randint(1, 6))) for _ in range(1000)]
    return made


@pytest.mark.parametrize("host", HOSTS)
def test_every_target_reads_as_the_full_reading_reads_it(host):
    for raw in targets():
        assert reading(parse_target, raw, host) == reading(keys._parse_any, raw, host), (raw, host)


def test_every_key_is_the_key_of_the_full_reading():
    origin = Origin(host="data.example", upstream="http://127.0.0.1:9", volatile_params=("b",))
    for raw, host in itertools.product(EDGES, HOSTS[:4]):
        got, full = reading(parse_target, raw, host), reading(keys._parse_any, raw, host)
        if isinstance(full, keys.Target):
            assert key_for(got, origin) == key_for(full, origin), (raw, host)


@pytest.mark.parametrize("raw", ["/d/0/1.bin", "/A/B~c_d-e.F?x=1&y=%20", "/", "/a/b..?"])
def test_a_plain_target_is_read_without_the_full_reading(raw, monkeypatch):
    expected = keys._parse_any(raw, "data.example")
    monkeypatch.setattr(keys, "_parse_any", lambda *a, **k: pytest.fail(f"{raw!r} was read in full"))
    assert parse_target(raw, "data.example") == expected


def test_a_refused_host_is_refused_every_time_and_the_hosts_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(keys, "_HOSTS", {})
    for _ in range(2):
        with pytest.raises(BadTarget, match="not a valid hostname"):
            parse_target("/a", "bad_host!")
    for n in range(keys._HOSTS_MAX * 2):
        assert parse_target("/a", f"h{n}.example").host == f"h{n}.example"
    assert len(keys._HOSTS) <= keys._HOSTS_MAX
