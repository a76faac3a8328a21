"""The prefetch pacing settings (--prefetch-busy-fills, --prefetch-idle-fills, --prefetch-quiet) come from
flags, NEZHA_* or --config, and are checked naming the field (cachenode/front/pacing.py)."""

import pytest

from nezha.config import CacheSettings, load
from nezha.errors import ConfigError

ORIGIN = ["x.example=http://127.0.0.1:1"]


def test_pacing_settings_from_flag_environment_and_file(tmp_path, monkeypatch):
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("prefetch_busy_fills: 3\nprefetch_idle_fills: 9\nprefetch_quiet: 2\n")
    monkeypatch.setenv("NEZHA_PREFETCH_IDLE_FILLS", "12")
    s = load(CacheSettings, config_file=cfg, flags={"origins": ORIGIN, "prefetch_busy_fills": 2})
    assert (s.prefetch_busy_fills, s.prefetch_idle_fills, s.prefetch_quiet) == (2, 12, 2.0)  # flag, env, file


def test_one_prefetch_fill_at_a_time_while_live_is_the_default():
    s = load(CacheSettings, flags={"origins": ORIGIN})
    assert (s.prefetch_busy_fills, s.prefetch_idle_fills, s.prefetch_quiet) == (1, 64, 0.25)


@pytest.mark.parametrize("flags,message", [
    ({"prefetch_busy_fills": 0}, "prefetch_busy_fills (0) must be at least 1"),
    ({"prefetch_idle_fills": 0}, "prefetch_idle_fills (0) must be at least 1"),
    ({"prefetch_quiet": 0}, "prefetch_quiet (0) must be a positive number of seconds"),
])
def test_bad_pacing_settings_name_the_field_and_value(flags, message):
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, flags={"origins": ORIGIN, **flags})
    assert message in str(e.value)
