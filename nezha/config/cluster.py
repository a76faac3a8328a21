"""`nezha ring` and `nezha stats`: where the shared index is."""

from __future__ import annotations

from pydantic import field_validator

from nezha.config.base import NezhaSettings
from nezha.values import check_redis_url


class ClusterSettings(NezhaSettings):
    """Cluster-wide commands (`nezha ring`, `nezha stats`): where the shared index is."""

    redis_url: str | None = None

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        return check_redis_url(v)
