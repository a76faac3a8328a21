"""What a user meets at the command line: an error names what they typed, a misspelt command gets a
suggestion, and every command's help says what it is and what its flags take."""

from __future__ import annotations

import argparse

import pytest

from nezha.cli import _unknown_word, build_parser, main
from nezha.config import CacheSettings, load
from nezha.errors import ConfigError


def command(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_an_origin_with_a_bad_upstream_is_named_by_its_flag_and_the_value_as_typed():
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, flags={"origins": ["www.cs.toronto.edu=http://127.0.0.1:9", "foo=bar"]})
    assert str(e.value) == "--origin 'foo=bar': origin upstream 'bar' must be an http:// or https:// URL"


def test_an_origin_of_nezha_origins_is_named_by_its_entry(monkeypatch):
    monkeypatch.setenv("NEZHA_ORIGINS", "a.example=http://127.0.0.1:9,bad host=http://127.0.0.1:9")
    with pytest.raises(ConfigError, match=r"^NEZHA_ORIGINS 'bad host=http://127.0.0.1:9': origin host 'bad host'"):
        load(CacheSettings)


def test_a_misspelt_command_gets_the_closest_one(capsys):
    assert main(["stat"]) == 2
    assert capsys.readouterr().err.strip() == "nezha: unknown command stat (did you mean stats?); see nezha --help"


def test_a_flags_value_is_never_taken_for_a_command():
    parser = build_parser()
    assert _unknown_word(parser, ["webhook", "--listen", "certz"]) is None
    assert "did you mean certs?" in _unknown_word(parser, ["webhook", "--listen", "127.0.0.1:1", "certz"])


def test_nezha_cache_help_says_what_the_command_does():
    assert "Run one cache node" in (command("cache").description or "")


@pytest.mark.parametrize("path", [("webhook",), ("webhook", "certs"), ("controller",), ("cache",), ("stats",)])
def test_every_log_level_flag_has_help_and_its_choices(path):
    action = command(*path)._option_string_actions["--log-level"]
    assert action.help and action.choices == ["debug", "info", "warning", "error", "critical"]
