"""The index's Redis URL forms (nezha/redis_url.py): one contract for nodes, controller, CLI and chart."""

from __future__ import annotations

import pytest

from nezha.redis_url import BadRedisURL, check, parse_sentinel, redact


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://:pw@redis.example:6380/2",
                                 "unix:///run/redis.sock?db=1", "redis+sentinel://:pw@10.0.0.1:26379/mymaster",
                                 "redis+sentinel://s1:26379,s2:26379,s3:26379/cache/3"])
def test_every_documented_form_is_taken(url):
    assert check(url) == url


@pytest.mark.parametrize("url,words", [
    ("http://redis:6379", "redis+sentinel://"),
    ("redis://host:6379/0 extra", "redis+sentinel://"),
    ("redis+sentinel://:pw@s1:26379", "SERVICE"),
    ("redis+sentinel://s1/mymaster", "HOST:PORT"),
])
def test_a_bad_url_is_refused_naming_the_forms(url, words):
    with pytest.raises(BadRedisURL) as e:
        check(url)
    assert words in str(e.value)


def test_a_refusal_never_shows_the_password():
    with pytest.raises(BadRedisURL) as e:
        check("redis+sentinel://:hunter2@s1/mymaster")
    assert "hunter2" not in str(e.value)


def test_a_sentinel_url_names_the_sentinels_the_service_the_db_and_the_masters_password():
    target = parse_sentinel("redis+sentinel://app:p%40ss@s1:26379,[::1]:26380/mymaster/2?sentinel_password=x")
    assert target.sentinels == (("s1", 26379), ("::1", 26380))
    assert (target.service, target.db, target.username, target.password) == ("mymaster", 2, "app", "p@ss")
    assert target.sentinel_password == "x"
    assert parse_sentinel("redis+sentinel://s1:26379/m").password is None


def test_redaction_hides_passwords_in_every_form():
    assert redact("redis://:s3cr3t@h:1/0") == "redis://:***@h:1/0"
    assert redact("rediss://user:s3cr3t@h:1/0") == "rediss://user:***@h:1/0"
    assert redact("redis+sentinel://:pw@a:1,b:2/m?sentinel_password=x") == "redis+sentinel://:***@a:1,b:2/m?sentinel_password=***"
    assert redact("redis://h:1/0") == "redis://h:1/0"
