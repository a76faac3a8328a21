"""`nezha demo` and `nezha origin`: the experiment on one machine and the slow host it downloads from.

Their sizes and rates are settings like any other, so `NEZHA_SIZE=10MB nezha
demo` and `--config` files mean what they say, and a NEZHA_* variable no
command reads is refused here as everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator

from nezha.config.base import QUIET_LOG_HELP, NezhaSettings
from nezha.config.flags import Flag
from nezha.values import parse_hostport, parse_size

# The dataset of the original experiment (cifar-100-python.tar.gz) and the rate its host gave in 2018.
CIFAR100_BYTES = 169_001_437
RATE_2018 = 3_500_000


def _positive_size(v: Any) -> int:
    size = parse_size(v)
    if size <= 0:
        raise ValueError("must be positive")
    return size


class DemoSettings(NezhaSettings):
    """`nezha demo`: how large the dataset, how slow its host, how many nodes, where the cache is kept."""

    flag_help: ClassVar[dict[str, str]] = QUIET_LOG_HELP

    size: Annotated[int, Flag(size=True)] = Field(CIFAR100_BYTES, description=(
        "size of the synthetic demo file, that of cifar-100-python.tar.gz unless given: bytes or with a suffix, "
        "e.g. 10MB, 1GiB"))
    rate: Annotated[int, Flag(size=True)] = Field(RATE_2018, description=(
        "origin throttle in bytes per second, suffixes allowed, e.g. 3.5MB; unless given, what the original "
        "experiment measured"))
    nodes: Annotated[int, Flag()] = Field(1, description=(
        "cache nodes; with 2 or more the warm download enters through another node and is a peer hit"))
    keep: Annotated[Path | None, Flag()] = Field(None, description="keep the cache folder here")

    @field_validator("size", "rate", mode="before")
    @classmethod
    def _sizes(cls, v: Any) -> int:
        return _positive_size(v)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be at least 1")
        return v


class LocalOriginSettings(NezhaSettings):
    """`nezha origin DIR`: where the slow host listens and how it answers."""

    flag_help: ClassVar[dict[str, str]] = QUIET_LOG_HELP

    listen: Annotated[str, Flag()] = Field("127.0.0.1:8000", description="HOST:PORT; port 0: any free one")
    rate: Annotated[int, Flag(size=True)] = Field(RATE_2018, description=(
        "bytes per second per connection, suffixes allowed, e.g. 3.5MB; 0: unthrottled; unless given, the "
        "demo's"))
    ranges: Annotated[bool, Flag()] = Field(False, description=(
        "answer Range requests when throttled too, as S3 does (default: one stream per download, like the "
        "demo's host)"))
    demo_file: Annotated[int | None, Flag(metavar="SIZE", size=True)] = Field(None, description=(
        "first write the demo's synthetic file of SIZE bytes (e.g. 50MB) as DIR/~kriz/cifar-100-python.tar.gz, "
        "the same bytes as nezha demo --size SIZE serves"))

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_hostport(v, field="listen")
        return v

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, v: Any) -> int:
        rate = parse_size(v)
        if rate < 0:
            raise ValueError("must not be negative (0: unthrottled)")
        return rate

    @field_validator("demo_file", mode="before")
    @classmethod
    def _demo_file(cls, v: Any) -> int | None:
        return None if v is None else _positive_size(v)

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_hostport(self.listen, field="listen")
