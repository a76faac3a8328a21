import pytest

from nezha.keys import BadTarget, Target, cache_key, object_id, parse_target


@pytest.mark.parametrize("raw,host,expect", [
    ("/~kriz/cifar.tar.gz", "www.cs.toronto.edu", Target("http", "www.cs.toronto.edu", "/~kriz/cifar.tar.gz", "")),
    ("/a?b=1&c=2", "WWW.CS.Toronto.EDU.:80", Target("http", "www.cs.toronto.edu", "/a", "b=1&c=2")),
    ("http://images.cocodataset.org/zips/train2017.zip", "other",
     Target("http", "images.cocodataset.org", "/zips/train2017.zip", "")),
    ("http://host.example", None, Target("http", "host.example", "/", "")),
    ("/a%20b#frag", "h.example", Target("http", "h.example", "/a%20b", "")),
])
def test_targets_are_read_from_origin_and_absolute_forms(raw, host, expect):
    assert parse_target(raw, host) == expect


@pytest.mark.parametrize("raw,host,why", [
    ("/../etc/passwd", "h.example", "dot segment"),
    ("/a/%2e%2e/b", "h.example", "dot segment"),
    ("/a/..%5cb", "h.example", "dot segment"),
    ("/a/./b", "h.example", "dot segment"),
    ("/a", None, "no Host"),
    ("/a", "bad_host!", "not a valid hostname"),
    ("/a", "[::1]:80", "IP literal"),
    ("ftp://h.example/a", None, "scheme"),
    ("http://user:pw@h.example/a", None, "credentials"),
    ("/a\x00b", "h.example", "control"),
    ("*", "h.example", "neither a path"),
])
def test_bad_targets_are_refused_with_the_reason(raw, host, why):
    with pytest.raises(BadTarget, match=why):
        parse_target(raw, host)


def test_key_keeps_scheme_host_path_and_query():
    t = Target("http", "h.example", "/d/x.bin", "v=2")
    assert cache_key(t) == "http://h.example/d/x.bin?v=2"


def test_key_drops_volatile_parameters_only():
    t = Target("https", "s3.example", "/b/k", "X-Amz-Signature=abc&versionId=7&X-Amz-Date=now")
    key = cache_key(t, volatile_params=("X-Amz-Signature", "X-Amz-Date"))
    assert key == "https://s3.example/b/k?versionId=7"
    assert cache_key(Target("http", "h", "/p", "sig=1"), volatile_params=("sig",)) == "http://h/p"


def test_object_id_is_stable_hex_and_differs_per_key():
    a = object_id("http://h/a")
    assert a == object_id("http://h/a") and len(a) == 64 and set(a) <= set("0123456789abcdef")
    assert a != object_id("http://h/b")
