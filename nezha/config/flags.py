"""Command-line flags made from the settings models, so a setting is written once.

A field marked `Annotated[T, Flag(...)]` is a flag of the commands built on
its class: `--field-name` (or `Flag.name`), its help the field's
`description` followed by "(default X)" from the field's default when the
description does not already say what the default is, its type, choices
and repetition from the annotation. A class's `flag_help` gives a command's
own wording for a field it inherits (`nezha up` says "node i uses
DIR/node-i" of `data_dir`). Every flag defaults to None, so a flag not given
never masks a NEZHA_* variable or the --config file (nezha/config/loader.py).
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic.fields import FieldInfo

if TYPE_CHECKING:
    from nezha.config.base import NezhaSettings


# Fields of every command (nezha/config/base.py), listed after a command's own flags.
_SHARED = ("log_level",)


@dataclass(frozen=True)
class Flag:
    """Marks a setting as a flag. `only`: the commands that offer it (default: every command of its
    class); `size`: it takes a size such as 500M, so it is read as text and its default shown in units;
    `exclusive`: flags of one name exclude each other on the command line (the model checks the rest)."""

    name: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    only: tuple[str, ...] = ()
    size: bool = False
    exclusive: str | None = None


def flag_of(info: FieldInfo) -> Flag | None:
    return next((m for m in info.metadata if isinstance(m, Flag)), None)


def flag_name(cls: type[NezhaSettings], field: str) -> str:
    """The flag that sets `field` (`origins` -> `--origin`), as errors name it."""
    flag = flag_of(cls.model_fields[field]) if field in cls.model_fields else None
    return (flag.name if flag is not None and flag.name else None) or "--" + field.replace("_", "-")


def offered(cls: type[NezhaSettings], command: str) -> dict[str, Flag]:
    """The fields of `cls` that are flags of `command`, in the order the model declares them."""
    found = {}
    for field, info in cls.model_fields.items():
        flag = flag_of(info)
        if flag is not None and (not flag.only or command in flag.only):
            found[field] = flag
    # The class's own first (nezha up's before the node settings it inherits); what every
    # command shares (--log-level) last.
    own = list(vars(cls).get("__annotations__", {}))
    return dict(sorted(found.items(), key=lambda item: (item[0] in _SHARED, item[0] not in own,
                                                        own.index(item[0]) if item[0] in own else 0)))


def add_settings(parser: argparse.ArgumentParser, cls: type[NezhaSettings], *, command: str) -> None:
    """Add a flag per setting `command` offers, and --config; remember them for `given`."""
    flags = offered(cls, command)
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for field, flag in flags.items():
        if field == next((f for f in flags if f in _SHARED), None):
            _add_config(parser, cls)
        if flag.exclusive is not None and flag.exclusive not in groups:
            groups[flag.exclusive] = parser.add_mutually_exclusive_group()
        into = parser if flag.exclusive is None else groups[flag.exclusive]
        into.add_argument(flag_name(cls, field), **_argument(cls, field, flag))
    if not any(f in _SHARED for f in flags):
        _add_config(parser, cls)
    parser.set_defaults(settings_flags=tuple(flags))


def _add_config(parser: argparse.ArgumentParser, cls: type[NezhaSettings]) -> None:
    parser.add_argument("--config", type=Path, help=cls.flag_help.get("config", "YAML file of settings"))


def _argument(cls: type[NezhaSettings], field: str, flag: Flag) -> dict[str, Any]:
    """add_argument's keywords for `field`: its help, and its type, action, choices and metavar."""
    info = cls.model_fields[field]
    kwargs: dict[str, Any] = {"dest": field, "default": None, "help": _help(cls, field, info, flag)}
    kind = _kind(info.annotation)
    if kind is bool:
        # A setting on by default is turned off by its --no- form.
        kwargs["action"] = argparse.BooleanOptionalAction if info.default is True else "store_true"
        return kwargs
    if kind is list:
        kwargs["action"] = "append"
    elif kind in (int, float, Path) and not flag.size:
        kwargs["type"] = kind
    if flag.choices is not None:
        kwargs["choices"] = list(flag.choices)
    if flag.metavar is not None:
        kwargs["metavar"] = flag.metavar
    return kwargs


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings flags of the command that ran, by field (None: not given), for `load(flags=)`."""
    return {field: getattr(args, field, None) for field in getattr(args, "settings_flags", ())}


def _kind(annotation: Any) -> Any:
    """bool, list, int, float or Path for an annotation of one of them (or of it or None); else str."""
    parts = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union else [annotation]
    if len(parts) != 1:
        return str
    (part,) = parts
    if typing.get_origin(part) is list:
        return list
    return part if part in (bool, int, float, Path) else str


def _help(cls: type[NezhaSettings], field: str, info: FieldInfo, flag: Flag) -> str:
    text = cls.flag_help.get(field, info.description or "")
    default = info.get_default(call_default_factory=True)
    if "default" in text or default is None or default is False or default in ((), [], {}):
        return text
    return f"{text} (default {_shown(default, size=flag.size)})"


def _shown(value: Any, *, size: bool) -> str:
    if size and isinstance(value, int) and value:
        # In the unit a user would type it: 1GiB, 64MiB, 3.5MB; else bytes (169001437).
        for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value % factor == 0:
                return f"{value // factor}{unit}"
        for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
            if value >= factor and value % (factor // 10) == 0:
                return f"{value / factor:g}{unit}"
        return str(value)
    if isinstance(value, Path) and not value.is_absolute():
        return f"./{value}"  # relative to where the command runs, as a shell would write it
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
