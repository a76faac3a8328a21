"""Flags are made from the settings models (nezha/config/flags.py): a default, a bound and a help text are
written once, in the field, and every command's flags, env variables and --config keys stay one set."""

from __future__ import annotations

import argparse

import pytest

from nezha.cli import build_parser
from nezha.config import CacheSettings, UP_SETS_PER_NODE, UpSettings, load
from nezha.config.flags import _shown, given, offered

# Options of a settings command that are not settings: what is printed, and the ring's operands.
NOT_SETTINGS = {"-h", "--help", "--config", "--json", "--weight"}


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + (name,), sub
                yield from commands(sub, path + (name,))


def command(*path: str) -> argparse.ArgumentParser:
    return dict(commands(build_parser()))[path]


def option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return parser._option_string_actions[flag]


def test_every_option_of_a_settings_command_is_made_from_its_model():
    """No flag is typed by hand beside the generated ones: each option names a field the command offers."""
    seen = 0
    for path, parser in commands(build_parser()):
        fields = parser.get_default("settings_flags")
        if fields is None:
            continue
        seen += 1
        options = {a.dest for a in parser._actions if a.option_strings and not set(a.option_strings) & NOT_SETTINGS}
        assert options == set(fields), f"nezha {' '.join(path)}"
    assert seen >= 8


def test_a_flags_help_is_the_fields_description_with_its_default():
    cache = command("cache")
    info = CacheSettings.model_fields["hot_reads"]
    assert option(cache, "--hot-reads").help == f"{info.description} (default 3)"
    assert option(cache, "--hot-reads").type is int and option(cache, "--hot-window").type is float
    assert "(default 1GiB)" in option(cache, "--chunk-threshold").help
    assert option(cache, "--data-dir").help.endswith("(default ./nezha-data)")
    # A description that says what its default is gets no second one.
    assert option(cache, "--capacity").help.count("default") == 1


def test_a_size_flag_takes_text_and_the_origin_flag_repeats_under_its_metavar():
    cache = command("cache")
    assert option(cache, "--capacity").type is None
    origin = option(cache, "--origin")
    assert (origin.dest, origin.metavar, type(origin).__name__) == ("origins", "HOST=UPSTREAM_URL", "_AppendAction")
    assert option(cache, "--log-level").choices == ["debug", "info", "warning", "error", "critical"]


def test_nezha_up_offers_no_flag_for_what_it_sets_for_each_node_and_says_its_own_words():
    up = command("up")
    assert not set(UP_SETS_PER_NODE) & set(offered(UpSettings, "up"))
    assert "--listen" not in up._option_string_actions and "--node-id" not in up._option_string_actions
    assert option(up, "--data-dir").help == "node i uses DIR/node-i (default ./nezha-data)"
    assert option(up, "--workers").help.endswith("(default 1)")


def test_the_webhook_and_its_certs_subcommand_each_offer_their_own_flags_of_one_model():
    webhook, certs = command("webhook"), command("webhook", "certs")
    assert "--listen" in webhook._option_string_actions and "--listen" not in certs._option_string_actions
    assert option(certs, "--days").dest == "cert_days" and "--days" not in webhook._option_string_actions
    assert option(certs, "--service").dest == "webhook_service"


@pytest.mark.parametrize("flags, env, expected", [
    ([], {}, None),
    ([], {"NEZHA_CAPACITY": "2G"}, 2 * 10**9),
    (["--capacity", "1G"], {"NEZHA_CAPACITY": "2G"}, 10**9),
])
def test_a_flag_not_given_leaves_the_environment_in_charge(flags, env, expected, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["cache", "--origin", "h.example=http://127.0.0.1:1", *flags])
    assert load(CacheSettings, flags=given(args)).capacity == expected


@pytest.mark.parametrize("value, shown", [(2**30, "1GiB"), (64 * 2**20, "64MiB"), (3_500_000, "3.5MB"),
                                          (169_001_437, "169001437")])
def test_a_size_default_is_shown_in_the_unit_a_user_would_type(value, shown):
    assert _shown(value, size=True) == shown


def test_a_setting_on_by_default_is_turned_off_by_its_no_flag_and_one_off_by_default_has_none():
    parser = build_parser()
    assert given(parser.parse_args(["cache"]))["small_gets"] is None  # not given: the model's default (on)
    assert CacheSettings.model_fields["small_gets"].default is True
    assert given(parser.parse_args(["cache", "--no-small-gets"]))["small_gets"] is False
    assert given(parser.parse_args(["cache", "--small-gets"]))["small_gets"] is True
    with pytest.raises(SystemExit):
        parser.parse_args(["cache", "--no-follower-leads"])
