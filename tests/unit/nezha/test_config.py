"""Settings come from one place, in a fixed order: flags, NEZHA_* env, YAML file, defaults."""

import pytest

from nezha.config import CacheSettings, Origin, load, parse_size
from nezha.errors import ConfigError


def test_flags_beat_environment_which_beats_the_yaml_file(tmp_path, monkeypatch):
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("listen: 127.0.0.1:7000\ncapacity: 1GiB\nreplicas: 3\n"
                   "origins:\n  - host: www.cs.toronto.edu\n    upstream: http://127.0.0.1:9000\n    default_ttl: 60\n")
    monkeypatch.setenv("NEZHA_CAPACITY", "2GiB")
    monkeypatch.setenv("NEZHA_REPLICAS", "2")
    s = load(CacheSettings, config_file=cfg, flags={"replicas": 1, "listen": None})
    assert s.replicas == 1  # flag
    assert s.capacity == 2 * 2**30  # env over file
    assert s.listen == "127.0.0.1:7000"  # file, since the flag was not given
    assert s.origins == [Origin(host="www.cs.toronto.edu", upstream="http://127.0.0.1:9000", default_ttl=60)]


@pytest.mark.parametrize("value", [
    "a.example=http://127.0.0.1:1,b.example=http://127.0.0.1:2",
    '["a.example=http://127.0.0.1:1", "b.example=http://127.0.0.1:2"]',
    '{"a.example": "http://127.0.0.1:1", "b.example": "http://127.0.0.1:2"}',
])
def test_origins_from_environment_as_a_comma_list_or_json(monkeypatch, value):
    monkeypatch.setenv("NEZHA_ORIGINS", value)
    s = load(CacheSettings)
    assert [(o.host, o.upstream) for o in s.origins] == [("a.example", "http://127.0.0.1:1"),
                                                         ("b.example", "http://127.0.0.1:2")]


@pytest.mark.parametrize("flags,message", [
    ({"origins": ["x.example"]}, "HOST=UPSTREAM_URL"),
    ({"origins": ["x.example=ftp://h/"]}, "http:// or https://"),
    ({"origins": ["x.example=http://a", "X.example=http://b"]}, "configured twice"),
    ({"listen": "nohostport"}, "listen must be HOST:PORT"),
    ({"capacity": "lots"}, "not a size"),
    ({"replicas": 0}, "replicas (0) must be at least 1"),
])
def test_bad_settings_are_one_config_error_naming_the_field(flags, message):
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, flags=flags)
    assert message in str(e.value)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(CacheSettings, config_file=tmp_path / "absent.yaml")


@pytest.mark.parametrize("text,expect", [("1048576", 2**20), ("500M", 500 * 10**6), ("10GiB", 10 * 2**30),
                                         ("1.5k", 1500), (4096, 4096)])
def test_sizes_take_decimal_and_binary_suffixes(text, expect):
    assert parse_size(text) == expect
