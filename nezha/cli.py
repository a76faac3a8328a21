"""The `nezha` command: flags -> settings -> logging -> run.

Each subcommand lives with its component (`cachenode.cli`, `webhook.cli`,
...), which exposes `register(subparsers)`; a subcommand's parser stores its
entry point as `func`. Components are imported lazily so that one broken
optional part cannot stop the others from starting.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nezha.errors import ConfigError

# module -> the subcommands it registers
COMMAND_MODULES = (
    "cachenode.cli",
    "nezha.cluster_cli",
    "webhook.cli",
    "controller.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nezha", description=__doc__.splitlines()[0])
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"nezha {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
