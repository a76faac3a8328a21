"""`--kubeconfig`'s help says what the settings do without the flag: NEZHA_KUBECONFIG or KUBECONFIG, else the
pod's service account."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nezha.cli import build_parser
from nezha.config import WebhookSettings, load


def kubeconfig_flags() -> dict[tuple[str, ...], argparse.Action]:
    found: dict[tuple[str, ...], argparse.Action] = {}

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if "--kubeconfig" in action.option_strings:
                found[path] = action
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(path + (name,), sub)

    walk((), build_parser())
    return found


def test_every_kubeconfig_flag_names_the_variable_read_without_it():
    flags = kubeconfig_flags()
    assert {("webhook",), ("webhook", "certs"), ("controller",), ("ca", "init")} <= set(flags)
    for path, action in flags.items():
        assert "KUBECONFIG" in (action.help or ""), f"nezha {' '.join(path)} --kubeconfig: {action.help!r}"


@pytest.mark.parametrize("variable", ["KUBECONFIG", "NEZHA_KUBECONFIG"])
def test_the_webhook_reads_the_kubeconfig_its_help_names(variable, tmp_path: Path, monkeypatch):
    config = tmp_path / "kubeconfig"
    config.write_text("")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("NEZHA_KUBECONFIG", raising=False)
    monkeypatch.setenv(variable, str(config))
    assert load(WebhookSettings, flags={"kubeconfig": None}).kubeconfig == config
