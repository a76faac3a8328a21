"""The hot-copy settings (--hot-reads, --hot-window, --hot-share) come from flags, NEZHA_* or --config, are
checked naming the field, and `nezha up` passes them to every node."""

import pytest

from nezha.config import CacheSettings, UpSettings, load
from nezha.errors import ConfigError

ORIGIN = ["x.example=http://127.0.0.1:1"]


def test_hot_copy_settings_from_flag_environment_and_file(tmp_path, monkeypatch):
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("hot_reads: 7\nhot_window: 5\nhot_share: 0.25\ncapacity: 1GiB\n")
    monkeypatch.setenv("NEZHA_HOT_WINDOW", "30")
    s = load(CacheSettings, config_file=cfg, flags={"origins": ORIGIN, "hot_reads": 0})
    assert (s.hot_reads, s.hot_window, s.hot_share) == (0, 30.0, 0.25)  # flag, env, file
    assert s.hot_capacity == 2**30 // 4


def test_hot_copies_are_on_by_default_within_a_tenth_of_capacity():
    s = load(CacheSettings, flags={"origins": ORIGIN, "capacity": "1000"})
    assert (s.hot_reads, s.hot_window, s.hot_share, s.hot_capacity) == (3, 60.0, 0.1, 100)
    assert load(CacheSettings, flags={"origins": ORIGIN}).hot_capacity is None  # no capacity, no share of it


@pytest.mark.parametrize("flags,message", [
    ({"hot_reads": -1}, "--hot-reads -1: hot_reads (-1) must be 0 (hot copies off) or more"),
    ({"hot_window": 0}, "hot_window (0) must be a positive number of seconds"),
    ({"hot_share": 0}, "hot_share (0) must be a share of capacity above 0 and at most 1"),
    ({"hot_share": 1.5}, "hot_share (1.5) must be"),
])
def test_bad_hot_copy_settings_name_the_flag_and_value(flags, message):
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, flags={"origins": ORIGIN, **flags})
    assert message in str(e.value)


def test_up_passes_hot_copy_settings_to_every_node(monkeypatch):
    monkeypatch.setenv("NEZHA_HOT_SHARE", "0.2")
    s = load(UpSettings, flags={"origins": ORIGIN, "hot_reads": 2})
    assert s.node_settings() == {"hot_reads": 2, "hot_share": 0.2, "workers": 1}
