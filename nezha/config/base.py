"""What every command's settings share: the `NEZHA_` prefix, the sources in order, a checked log level.

Precedence, highest first: command-line flags (passed to the constructor),
`NEZHA_*` variables, the `--config` file (set in `file_settings` by the
loader while it builds the object), then the field's default.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nezha.config.flags import Flag

# The --config file's settings while `load` builds a settings object (the lowest-priority source).
file_settings: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("nezha_file_settings",
                                                                                     default=None)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The kubeconfig of every command that talks to a cluster: --kubeconfig, NEZHA_KUBECONFIG or KUBECONFIG;
# none: the pod's service account.
# A command whose output is what the user reads (a result, a table, the demo's figures) logs at this
# level unless --log-level is given (NezhaSettings.quiet_log_level); QUIET_LOG_HELP says so.
QUIET_LEVEL = "warning"
QUIET_LOG_HELP = {"log_level": f"log level on stderr (default {QUIET_LEVEL})"}
Kubeconfig = Annotated[Path | None, Flag()]


def kubeconfig_field() -> Any:
    return Field(default=None, validation_alias=AliasChoices("kubeconfig", "NEZHA_KUBECONFIG", "KUBECONFIG"),
                 description="kubeconfig (default: NEZHA_KUBECONFIG or KUBECONFIG, else the pod's service account)")


class _FileSource(PydanticBaseSettingsSource):
    """The --config file, already read and checked by `load`."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(file_settings.get() or {})


class NezhaSettings(BaseSettings):
    # forbid: a misspelt key is an error, never a setting silently left at its default.
    # defer_build: a model's validator is built when the command that reads it first does,
    # so a node (and each of its workers) does not build those of the other six commands at
    # import (their fields, which the flags are made from, are known without it).
    model_config = SettingsConfigDict(env_prefix="NEZHA_", extra="forbid", validate_default=True, defer_build=True)

    # A command's own wording of a flag's help for a field it inherits, by field (or "config"),
    # where the field's description speaks of another command (nezha/config/flags.py).
    flag_help: ClassVar[dict[str, str]] = {}
    # Settings a command once had, by field, with what replaced them: the loader names the
    # replacement where it would otherwise say only "unknown key" (nezha/config/loader.py).
    removed: ClassVar[dict[str, str]] = {}

    log_level: Annotated[str, Flag(choices=LOG_LEVELS)] = Field("info", description="how much to log")

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        if v.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return v.lower()

    def quiet_log_level(self) -> str:
        """The log level a command whose output the user reads runs at: the one asked for, else QUIET_LEVEL."""
        return self.log_level if "log_level" in self.model_fields_set else QUIET_LEVEL

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))
