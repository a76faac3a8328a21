"""Build a command's settings from its flags, the environment and a `--config` file, or say what is wrong.

Every problem comes back at once in one ConfigError, a line each, naming
the flag, variable or file key as the user wrote it and the value seen.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

from pydantic_settings import SettingsError

from nezha.config.base import NezhaSettings, file_settings
from nezha.config.flags import flag_name
from nezha.errors import ConfigError
from nezha.origins import Origin, origin_specs

# Reserved for the test suite (NEZHA_TEST_KUBECONFIG ...) and for what `nezha cache --workers`
# tells each worker it starts (cachenode/workers/supervisor.py): never a setting, never refused.
_TEST_VARIABLES = ("NEZHA_TEST_", "NEZHA_WORKER_")
# The command being run (`nezha cache`), for messages; set by nezha.cli.
COMMAND = "nezha"


def _setting_names(cls: type[NezhaSettings]) -> dict[str, str]:
    """Every name a setting of `cls` answers to in a file or the environment -> its field."""
    names: dict[str, str] = {}
    for field, info in cls.model_fields.items():
        names[field] = field
        names[f"NEZHA_{field.upper()}"] = field
        alias = info.validation_alias
        for choice in getattr(alias, "choices", ()) or ():
            if isinstance(choice, str):
                names[choice] = field
    return names


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _read_file(path: Path, cls: type[NezhaSettings]) -> tuple[dict[str, Any], list[str]]:
    """The --config file's mapping, and a line for each unknown key in it."""
    import yaml  # here: only a command given --config FILE reads YAML (every node worker imports this module)

    where = f"--config {path}"
    if not path.is_file():
        raise ConfigError(f"{where}: does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{where}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot be read: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping of setting names to values, got {type(data).__name__}")
    fields = list(cls.model_fields)
    problems = [f"{where}: {k!r} {cls.removed[k]}" if k in cls.removed else
                f"{where}: unknown key {k!r}{_did_you_mean(str(k), fields)}" for k in data if k not in fields]
    return data, problems


def _env_problems(cls: type[NezhaSettings], command: str) -> list[str]:
    """A NEZHA_* variable that no Nezha command reads is a typo. One that another command reads
    is left alone: a pod's environment serves every command run in it (`kubectl exec nezha-cache-0
    -- nezha stats` sees the node's NEZHA_CLUSTER_TOKEN)."""
    ours = [n for n in _setting_names(cls) if n.startswith("NEZHA_")]
    anyone = {n for sub in _settings_classes() for n in _setting_names(sub) if n.startswith("NEZHA_")}
    removed = {f"NEZHA_{field.upper()}": why for sub in _settings_classes() for field, why in sub.removed.items()}
    return [f"{name}: {removed[name]}" if name in removed else
            f"{name}: not a setting of {command} or any other nezha command{_did_you_mean(name, ours)}"
            for name in sorted(os.environ)
            if name.startswith("NEZHA_") and not name.startswith(_TEST_VARIABLES) and name not in anyone]


def _settings_classes() -> list[type[NezhaSettings]]:
    found, todo = [], list(NezhaSettings.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def _source(cls: type[NezhaSettings], field: str, given: dict[str, Any], file: dict[str, Any],
            path: Path | None) -> str:
    """Where a field's value came from, as the user would write it."""
    if field in given:
        return flag_name(cls, field)
    env = f"NEZHA_{field.upper()}"
    if env in os.environ:
        return env
    if field in file:
        return f"{field} in {path}"
    return field


def _typed_origin(index: int, given: dict[str, Any]) -> str | None:
    """The `index`th origin as the user typed it, HOST=URL, when it came from --origin or NEZHA_ORIGINS
    (a file's or JSON's origin is named by its place instead)."""
    if "origins" in given:
        specs = given["origins"]
    else:
        text = os.environ.get("NEZHA_ORIGINS")
        specs = origin_specs(text) if text is not None else None
    if isinstance(specs, list) and index < len(specs) and isinstance(specs[index], str):
        return specs[index]
    return None


def load(cls: type[NezhaSettings], *, flags: dict[str, Any] | None = None, config_file: Path | None = None,
         command: str | None = None) -> Any:
    """Build settings of `cls` from flags, environment and an optional YAML file.

    Flags that were not given (None) do not mask the environment. Every
    problem comes back in one ConfigError, one line each, naming the flag,
    variable or file key and the value: a bad value, an unknown key in the
    file, a `NEZHA_*` variable that is no setting of this command (with a
    "did you mean" when one is close).
    """
    from pydantic import ValidationError

    command = command or COMMAND
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    path = Path(config_file) if config_file else None
    file, problems = _read_file(path, cls) if path is not None else ({}, [])
    problems += _env_problems(cls, command)
    if problems:
        raise ConfigError("\n".join(problems))
    token = file_settings.set(file)
    try:
        return cls(**given)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = [str(p) for p in err["loc"]]
            message = re.sub(r"^(Value|Assertion) error, ", "", err["msg"])
            if not loc:
                lines.append(message)
                continue
            inner = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
            source = _source(cls, loc[0], given, file, path)
            # "origins[0].ttl in nezha.yaml", not "origins in nezha.yaml[0].ttl"
            where = (loc[0] + inner + source[len(loc[0]):]) if source.startswith(loc[0] + " in ") \
                else source + inner
            if loc[0] == "origins" and len(loc) > 1 and loc[1].isdigit() and \
                    (typed := _typed_origin(int(loc[1]), given)) is not None:
                lines.append(f"{source} {typed!r}: {message}")  # --origin 'foo=bar', as typed
                continue
            if err["type"] == "extra_forbidden" and loc[0] == "origins":
                lines.append(f"{where}: unknown key in an origin{_did_you_mean(loc[-1], list(Origin.model_fields))}")
                continue
            value = err.get("input")
            if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
                # A repeated flag (--origin a --origin b) as the user typed it, not a Python list.
                shown = "".join(f" {str(v)!r}" for v in value)
            else:
                shown = "" if isinstance(value, (dict, list, tuple)) or value is None else \
                    f" {str(value)!r}" if isinstance(value, Path) else f" {value!r}"
            lines.append(f"{where}{shown}: {message}")
        raise ConfigError("\n".join(lines)) from e
    except SettingsError as e:
        raise ConfigError(f"{e}: {e.__cause__}") from e
    finally:
        file_settings.reset(token)
