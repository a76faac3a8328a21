"""Settings for every component, read in one place.

Precedence, highest first: command-line flags, `NEZHA_*` environment
variables, an optional YAML file (`--config FILE`, a flat mapping of field
names), then each field's default. Nothing else in Nezha reads the
environment. Each command gets its own class (a module each here) and
passes it on as `settings=`; `base` holds what they share and `loader`
builds one from a command's sources.

The names below are what the rest of Nezha imports (`from nezha.config
import CacheSettings`); the origin table lives in nezha/origins.py and the
value parsers in nezha/values.py, re-exported here for those importers.
"""

from nezha.config.base import LOG_LEVELS, NezhaSettings
from nezha.config.ca import CaInitSettings
from nezha.config.cache import DEFAULT_CLUSTER_REPLICAS, CacheSettings
from nezha.config.cluster import ClusterSettings
from nezha.config.controller import ControllerSettings
from nezha.config.dev import DemoSettings, LocalOriginSettings
from nezha.config.loader import load
from nezha.config.up import UP_SETS_PER_NODE, UpSettings
from nezha.config.verify import VerifySettings
from nezha.config.webhook import WebhookSettings
from nezha.origins import HOST_PLACEHOLDER, Origin, OriginTable
from nezha.values import check_redis_url, parse_hostport, parse_size

__all__ = [
    "CaInitSettings", "CacheSettings", "ClusterSettings", "ControllerSettings", "DEFAULT_CLUSTER_REPLICAS",
    "DemoSettings", "HOST_PLACEHOLDER", "LOG_LEVELS", "LocalOriginSettings", "NezhaSettings", "Origin", "OriginTable", "UP_SETS_PER_NODE", "UpSettings", "VerifySettings", "WebhookSettings",
    "check_redis_url", "load", "parse_hostport", "parse_size",
]
