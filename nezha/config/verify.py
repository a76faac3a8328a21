"""`nezha verify`: the stopped node's data folder to check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field

from nezha.config.base import QUIET_LOG_HELP, NezhaSettings
from nezha.config.flags import Flag


class VerifySettings(NezhaSettings):
    """The data folder of a node that is not running (`nezha cache --data-dir`)."""

    flag_help: ClassVar[dict[str, str]] = QUIET_LOG_HELP

    data_dir: Annotated[Path, Flag()] = Field(Path("./nezha-data"), description=(
        "the data folder of a stopped node to check, as given to nezha cache --data-dir"))
