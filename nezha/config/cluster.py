"""`nezha ring` and `nezha stats`: where the shared index is."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, field_validator

from nezha.config.base import QUIET_LEVEL, NezhaSettings
from nezha.config.flags import Flag
from nezha.values import check_redis_url


class ClusterSettings(NezhaSettings):
    """Cluster-wide commands (`nezha ring`, `nezha stats`): where the shared index is."""

    # Logs share stdout with the result: the commands log at warning unless --log-level is given.
    flag_help: ClassVar[dict[str, str]] = {"log_level": f"log level (default {QUIET_LEVEL}, so stdout stays the result)"}

    redis_url: Annotated[str | None, Flag()] = Field(None, description=(
        "the index (redis://[:PASSWORD@]HOST:PORT/DB or rediss://...)"))

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        return check_redis_url(v)
