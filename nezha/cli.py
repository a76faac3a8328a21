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

from nezha.config import loader as config_loader
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
webhook. Every flag is also a NEZHA_* variable and a key of --config FILE,
except --json and ring set's --weight, which say what to print or write
rather than how a command runs."""


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


def _unknown_word(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """A one-line error for the first `--flag` that no parser on the command's path takes,
    or the first command that none has (`nezha stat`), with the closest one; None when every
    flag and command is known.

    argparse would report it from the top-level parser, with the top-level
    usage and no suggestion, and only after other errors (a required flag
    missing: the one the user misspelt)."""
    command = [parser.prog]
    takes_value = False
    for token in argv:
        if token == "--":
            break
        if takes_value:  # the value of the flag before it, never a command
            takes_value = False
            continue
        if not token.startswith("-"):
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if sub is not None:
                if token not in sub.choices:
                    return _unknown(command, "command", token, list(sub.choices))
                parser = sub.choices[token]
                command.append(token)
            continue
        flag = token.split("=", 1)[0]
        known = list(parser._option_string_actions)
        matches = [k for k in known if k.startswith(flag)]
        if flag not in known and len(matches) != 1:  # argparse takes a unique prefix
            return _unknown(command, "flag", flag, [k for k in known if k.startswith("--")])
        action = parser._option_string_actions[flag if flag in known else matches[0]]
        takes_value = "=" not in token and action.nargs != 0
    return None


def _unknown(command: list[str], what: str, word: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{' '.join(command)}: unknown {what} {word}{hint}; see {' '.join(command)} --help"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if (unknown := _unknown_word(parser, argv)) is not None:
        print(unknown, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.argv = list(argv)  # `nezha cache --workers N` starts each worker with the same arguments
    command = f"nezha {args.command}"
    config_loader.COMMAND = command
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
