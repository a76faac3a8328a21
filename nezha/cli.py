"""The `nezha` command: one entry point, a subcommand per component.

Each subcommand lives with its component (`cachenode.cli`, `webhook.cli`,
...), which exposes `register(subparsers)`; a subcommand's parser stores its
entry point as `func`. Components are imported lazily so that one broken
optional part cannot stop the others from starting.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nezha import config
from nezha.errors import ConfigError, RunError

# module -> the subcommands it registers
COMMAND_MODULES = (
    "cachenode.cli",
    "nezha.dev.cli",
    "nezha.cluster_cli",
    "webhook.cli",
    "controller.cli",
    "nezha.ca_cli",
)


DESCRIPTION = """\
Nezha caches the datasets ML training jobs download. Run one cache node
(`nezha cache`), a local cluster (`nezha up`), or the demo (`nezha demo`);
on Kubernetes the chart in helm/nezha runs the nodes, the controller and the
webhook. Every flag is also a NEZHA_* variable and a key of --config FILE."""


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("nezha")
    except PackageNotFoundError:  # run from a checkout that was never installed
        ours = "unknown"
    parser = argparse.ArgumentParser(prog="nezha", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"nezha {ours}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue  # that part is not built yet

            raise
        module.register(sub)
    return parser


def _flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> the long flag that sets it, over every subcommand (`origins` -> `--origin`)."""
    names: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names.update(_flag_names(sub))
        elif action.option_strings and action.dest not in ("help", "version"):
            names.setdefault(action.dest, max(action.option_strings, key=len))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = f"nezha {args.command}"
    config.FLAG_NAMES.update(_flag_names(parser))
    config.COMMAND = command
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        # One line per problem, each naming the command: exit 2, nothing started.
        for line in str(e).splitlines() or [""]:
            print(f"{command}: {line}", file=sys.stderr)
        return 2
    except RunError as e:
        print(f"{command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
