"""`nezha controller`: the controller's settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from nezha.config.base import Kubeconfig, NezhaSettings, kubeconfig_field
from nezha.config.flags import Flag
from nezha.origins import Origin, OriginTable, parse_origins
from nezha.values import check_redis_url, parse_hostport, parse_size

PEER_ADDRESSES = ("dns", "pod-ip")


class ControllerSettings(NezhaSettings):
    """The controller (`nezha controller`): which cache StatefulSet it runs, and how.

    Durations follow controller-runtime's leader election defaults and are
    checked at start-up, naming the fields: a lease shorter than the renew
    deadline could be taken while its holder still believes it leads.
    """

    namespace: Annotated[str | None, Flag()] = Field(None, description=(
        "namespace of the cache StatefulSet (required)"))
    statefulset: Annotated[str | None, Flag()] = Field(None, description="name of the cache StatefulSet (required)")
    redis_url: Annotated[str | None, Flag()] = Field(None, description=(
        "the shared index, redis://[:PASSWORD@]HOST:PORT/DB (required)"))
    identity: Annotated[str | None, Flag()] = Field(None, description=(
        "this replica's name in the leader Lease (default: the host name)"))
    kubeconfig: Kubeconfig = kubeconfig_field()
    lease_name: Annotated[str, Flag()] = Field("nezha-controller", description=(
        "coordination.k8s.io Lease the replicas elect a leader with"))
    # dns: <pod>.<serviceName>.<ns>.svc:<port>; pod-ip: <podIP>:<port>
    peer_address: Annotated[str, Flag(choices=PEER_ADDRESSES)] = Field("dns", description=(
        "how peers reach a node: <pod>.<service>.<ns>.svc (dns) or the pod IP (pod-ip)"))
    peer_port: Annotated[int, Flag()] = Field(8080, description="node port when the container has no port named http")
    cluster_token_file: Annotated[Path | None, Flag()] = Field(None, description=(
        "file holding the nodes' cluster token"))
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # A change of pods or StatefulSet is written to the ring at most this long after it arrives;
    # changes within it share one write.
    batch_window: float = 0.05
    # HOST:PORT of /healthz and /readyz (kubelet probes); none: no listener.
    health_listen: Annotated[str | None, Flag()] = Field(None, description=(
        "HOST:PORT answering /healthz and /readyz for probes, and /metrics (default: none)"))
    # Keep a copy of ConfigMap nezha-ca (the CA bundle labelled pods mount for
    # HTTPS, `nezha ca init`) in every namespace (controller/trust.py).
    publish_ca: Annotated[bool, Flag()] = Field(False, description=(
        "keep a copy of ConfigMap nezha-ca (the CA bundle from `nezha ca init`) in every namespace, for pods of "
        "tls: true rules to mount (default: off)"))
    # The cache nodes' origin table (the chart mounts the nodes' own file): the
    # controller keys a prefetched URL with its origin's rules (volatile_params),
    # so it asks the node that stores it under that key.
    origins: Annotated[list[Origin], NoDecode] = Field(default_factory=list)
    # Prefetch by name (controller/prefetch.py, docs/controller.md "Prefetch").
    prefetch_fills: Annotated[int, Flag()] = Field(16, description=(
        "prefetch fills in flight at once across every workload, so a large expansion leaves the tier "
        "room for its live traffic"))
    prefetch_max_objects: Annotated[int, Flag()] = Field(1_000_000, description=(
        "a prefetch name listing more objects than this is refused whole"))
    hub_host: Annotated[str, Flag()] = Field("huggingface.co", description=(
        "the Hugging Face Hub's origin host, which hf:// names are listed on and fetched from"))
    s3_host: Annotated[str, Flag()] = Field("s3.amazonaws.com", description=(
        "the S3 origin host s3:// names are listed on and fetched from, path-style"))
    prefetch_spread_max: Annotated[int, Flag(size=True)] = Field(1 << 30, description=(
        "the largest object nezha.io/prefetch-spread: all copies to every node (the nodes' hot share bounds "
        "it too)"))
    prefetch_gate_wait: Annotated[float, Flag()] = Field(600.0, gt=0, description=(
        "seconds a pod of a nezha.io/prefetch-spread: all workload is held (its scheduling gate) at most while "
        "the spread is not done; then it is let go with a Warning Event"))
    s3_region: Annotated[str, Flag()] = Field("us-east-1", description=(
        "the region private s3:// requests are signed for (SigV4), the buckets' own"))
    s3_page_keys: Annotated[int, Flag()] = Field(1000, description=(
        "keys asked for per page of an s3:// name's listing (ListObjectsV2 max-keys, at most 1000)"))

    @field_validator("origins", mode="before")
    @classmethod
    def _parse_origins(cls, v: Any) -> Any:
        return parse_origins(v)

    @field_validator("prefetch_spread_max", mode="before")
    @classmethod
    def _spread_max(cls, v: Any) -> Any:
        return parse_size(v)

    @field_validator("health_listen")
    @classmethod
    def _health_listen(cls, v: str | None) -> str | None:
        if v is not None:
            parse_hostport(v, field="health_listen (--health-listen)")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        return check_redis_url(v)

    @field_validator("peer_address")
    @classmethod
    def _peer_address(cls, v: str) -> str:
        if v not in PEER_ADDRESSES:
            raise ValueError(f"peer_address must be dns or pod-ip (--peer-address), got {v!r}")
        return v

    @field_validator("namespace", "statefulset", "lease_name")
    @classmethod
    def _dns_label(cls, v: str | None, info) -> str | None:
        if v is not None and not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", v):
            raise ValueError(f"{info.field_name} {v!r} is not a Kubernetes object name "
                             f"(--{info.field_name.replace('_', '-')})")
        return v

    @model_validator(mode="after")
    def _check(self) -> "ControllerSettings":
        for name in ("namespace", "statefulset", "redis_url"):
            if getattr(self, name) is None:
                flag = name.replace("_", "-")
                raise ValueError(f"--{flag} is required (or NEZHA_{name.upper()}, or {name} in --config)")
        if not 0 < self.peer_port < 65536:
            raise ValueError(f"peer_port ({self.peer_port}) must be a TCP port (--peer-port)")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"leader election needs 0 < retry_period ({self.retry_period:g}s) < renew_deadline "
                f"({self.renew_deadline:g}s) < lease_duration ({self.lease_duration:g}s)")
        if not 1 <= self.prefetch_fills <= 1024:
            raise ValueError(f"prefetch_fills ({self.prefetch_fills}) must be between 1 and 1024 (--prefetch-fills)")
        if not 1 <= self.s3_page_keys <= 1000:
            raise ValueError(f"s3_page_keys ({self.s3_page_keys}) must be between 1 and 1000 (--s3-page-keys)")
        if self.prefetch_max_objects < 1:
            raise ValueError(f"prefetch_max_objects ({self.prefetch_max_objects}) must be at least 1 "
                             "(--prefetch-max-objects)")
        if self.batch_window < 0 or self.batch_window > 1:
            raise ValueError(f"batch_window ({self.batch_window:g}s) must be between 0 and 1 s")
        if self.kubeconfig is not None and not self.kubeconfig.is_file():
            raise ValueError(f"kubeconfig {self.kubeconfig} does not exist (--kubeconfig or KUBECONFIG)")
        if self.cluster_token_file is not None and not self.cluster_token_file.is_file():
            raise ValueError(f"cluster_token_file {self.cluster_token_file} does not exist (--cluster-token-file)")
        return self

    @property
    def origin_table(self) -> OriginTable:
        return OriginTable(self.origins)

    @property
    def holder(self) -> str:
        if self.identity:
            return self.identity
        import socket

        return socket.gethostname()

    @property
    def cluster_token(self) -> str | None:
        if self.cluster_token_file is None:
            return None
        return self.cluster_token_file.read_text().strip() or None
