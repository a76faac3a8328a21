"""The chunk settings (--chunk-threshold, --chunk-size) come from flags, NEZHA_* or --config, take sizes,
are checked naming the field, may be set per origin, and `nezha up` passes them to every node."""

import pytest

from nezha.config import CacheSettings, UpSettings, load
from nezha.errors import ConfigError

ORIGIN = ["x.example=http://127.0.0.1:1"]


def test_chunks_default_to_1gib_objects_in_64mib_chunks():
    s = load(CacheSettings, flags={"origins": ORIGIN})
    assert (s.chunk_threshold, s.chunk_size) == (2**30, 64 * 2**20)
    assert s.chunking(s.origins[0]) == (2**30, 64 * 2**20)


def test_chunk_settings_from_flag_environment_and_file(tmp_path, monkeypatch):
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("chunk_size: 8MiB\nchunk_threshold: 5GiB\n")
    monkeypatch.setenv("NEZHA_CHUNK_SIZE", "16MiB")
    s = load(CacheSettings, config_file=cfg, flags={"origins": ORIGIN, "chunk_threshold": "0"})
    assert (s.chunk_threshold, s.chunk_size) == (0, 16 * 2**20)  # flag, env over file


def test_an_origin_entry_sets_its_own_chunking(tmp_path):
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("origins:\n- host: big.example\n  upstream: http://127.0.0.1:1\n  chunk_threshold: 256MiB\n"
                   "  chunk_size: 32MiB\n- host: small.example\n  upstream: http://127.0.0.1:2\n  chunk_threshold: 0\n"
                   "- host: plain.example\n  upstream: http://127.0.0.1:3\n")
    s = load(CacheSettings, config_file=cfg)
    table = s.origin_table
    assert s.chunking(table["big.example"]) == (256 * 2**20, 32 * 2**20)
    assert s.chunking(table["small.example"]) == (0, 64 * 2**20)
    assert s.chunking(table["plain.example"]) == (2**30, 64 * 2**20)


@pytest.mark.parametrize("flags,message", [
    ({"chunk_size": "4KiB"}, "chunk_size (4096 bytes) must be at least 1MiB"),
    ({"chunk_threshold": "lots"}, "not a size: 'lots'"),
])
def test_bad_chunk_settings_name_the_field_and_value(flags, message):
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, flags={"origins": ORIGIN, **flags})
    assert message in str(e.value)


def test_up_passes_chunk_settings_to_every_node():
    s = load(UpSettings, flags={"origins": ORIGIN, "chunk_threshold": "64MiB", "chunk_size": "4MiB"})
    assert s.node_settings() == {"chunk_threshold": 64 * 2**20, "chunk_size": 4 * 2**20, "workers": 1}
