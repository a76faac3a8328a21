"""`nezha up`: a local cluster's settings, a node's and its own."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from nezha.config.cache import DEFAULT_CLUSTER_REPLICAS, CacheSettings
from nezha.config.flags import Flag


# Settings of a node that `nezha up` sets for each node itself: never taken from its flags,
# environment or --config (the value names the setting it derives them from).
UP_SETS_PER_NODE = {"listen": "--base-port", "advertise": "--base-port", "node_id": "--nodes",
                    "tls_listen": "--tls-base-port"}


class UpSettings(CacheSettings):
    """A local cluster (`nezha up`): the node settings it gives every node, and its own.

    The node's fields are inherited, not copied: a setting a node takes,
    `nezha up` takes the same way (flag, NEZHA_* variable or --config key)
    and passes on, except the address and name of each node (UP_SETS_PER_NODE).
    `data_dir` holds node i's folder DIR/node-i and the embedded index.
    """

    # A node setting's help in nezha up's own words, where nezha cache's speaks of one node.
    flag_help: ClassVar[dict[str, str]] = {
        "data_dir": "node i uses DIR/node-i",
        "replicas": f"owners per key (default min({DEFAULT_CLUSTER_REPLICAS}, NODES): any one node can stop without "
                    "losing an object)",
        "redis_url": "index to use; default: an embedded one in DIR/index",
        "capacity": "disk each node may use, e.g. 10GiB or 500M; least recently used objects are evicted beyond it "
                    "(default: unbounded)",
        "log_level": "the nodes' log level, in DIR/node-i.log, and when given nezha up's own on stderr, else "
                     "warning",
        "config": "YAML file of settings: nezha up's and any of nezha cache's",
    }

    nodes: Annotated[int, Flag()] = Field(3, description="node processes")
    # Node i listens on 127.0.0.1:base_port+i and, with tls_base_port, answers TLS on tls_base_port+i.
    base_port: Annotated[int, Flag()] = Field(8080, description="node i listens on 127.0.0.1:BASE+i")
    tls_base_port: Annotated[int | None, Flag()] = Field(None, description=(
        "node i also answers TLS on 127.0.0.1:BASE+i, as nezha cache --tls-listen does (default: no TLS port)"))
    # Replace a ring the index already holds; leave this one's ring in the index on exit.
    force: Annotated[bool, Flag()] = Field(False, description=(
        "replace a ring the index already holds (one this command did not write); without it nezha up refuses"))
    keep_ring: Annotated[bool, Flag()] = Field(False, description=(
        "leave the ring in the index on exit (default: remove it, since its nodes are gone)"))
    # Worker processes per node. Not `auto`, as for one node: the nodes share
    # this machine's cores, so N nodes of a worker per core would each
    # contend with the others for every core.
    workers: Annotated[int | Literal["auto"], Flag()] = Field(1, description=(
        "processes per node (nezha cache --workers): a number or auto, a process per CPU for each node; the nodes "
        "share this machine's cores"))

    @model_validator(mode="before")
    @classmethod
    def _replicas_default(cls, data: Any) -> Any:
        """Owners per key unless given: min(2, nodes), so one node can stop without losing an object."""
        if isinstance(data, dict) and data.get("replicas") in (None, ""):
            try:
                nodes = int(data.get("nodes", cls.model_fields["nodes"].default))
            except (TypeError, ValueError):
                return data  # the nodes field reports it
            data = {**data, "replicas": max(1, min(DEFAULT_CLUSTER_REPLICAS, nodes))}
        return data

    @model_validator(mode="after")
    def _check_up(self) -> "UpSettings":
        for name, instead in UP_SETS_PER_NODE.items():
            if name in self.model_fields_set:
                raise ValueError(f"{name} (NEZHA_{name.upper()}, or {name} in --config): nezha up sets it for "
                                 f"each node itself; use {instead}")
        if self.nodes < 1:
            raise ValueError(f"--nodes ({self.nodes}) must be at least 1")
        if self.replicas is not None and self.replicas > self.nodes:
            raise ValueError(f"--replicas {self.replicas}: cannot exceed --nodes ({self.nodes}); each key is kept on "
                             "that many different nodes")
        for flag, base in (("--base-port", self.base_port), ("--tls-base-port", self.tls_base_port)):
            if base is None:
                continue
            last = base + self.nodes - 1
            if base < 1 or last > 65535:
                raise ValueError(f"{flag} {base}: node-{self.nodes - 1} would listen on port {last}, out of range "
                                 f"(a TCP port is 0-65535; nezha up needs {self.nodes} from 1 up)")
        return self

    def node_settings(self) -> dict[str, Any]:
        """What every node gets from these settings, as --config keys: the node's own fields
        that differ from their defaults, without those nezha up sets per node or passes otherwise."""
        passed_otherwise = {"data_dir", "redis_url", "replicas", "cluster_token", "origins", "log_level"}
        keep = set(CacheSettings.model_fields) - set(UP_SETS_PER_NODE) - passed_otherwise
        # workers always: nezha up's default differs from a node's own.
        return {**self.model_dump(mode="json", include=keep, exclude_defaults=True), "workers": self.workers}
