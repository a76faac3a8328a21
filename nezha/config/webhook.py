"""`nezha webhook` and `nezha webhook certs`: the admission webhook's settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, field_validator, model_validator

from nezha.config.base import NezhaSettings
from nezha.values import parse_hostport


class WebhookSettings(NezhaSettings):
    """The admission webhook (`nezha webhook`)."""

    listen: str = "127.0.0.1:8443"
    # HOST:PORT serving /metrics over plain HTTP (webhook/metrics.py); none: no listener.
    metrics_listen: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    rules: Path | None = None
    cache_ip: str | None = None
    cache_service: str = "nezha-cache"
    namespace: str = "nezha"
    max_body_bytes: int = 3 * 1024 * 1024
    rules_reload_interval: float = 2.0
    # How often the serving certificate and key files are checked for a renewed pair.
    tls_reload_interval: float = 10.0
    # Learn the cache Service ClusterIP from the API (in-cluster or kubeconfig)
    # while some rule leaves `ip` out and --cache-ip is not given.
    watch_service: bool = True
    # --kubeconfig, NEZHA_KUBECONFIG or KUBECONFIG (as for the controller); none: the pod's service account.
    kubeconfig: Path | None = Field(default=None, validation_alias=AliasChoices(
        "kubeconfig", "NEZHA_KUBECONFIG", "KUBECONFIG"))
    # mode: env rules point HTTP_PROXY here; default http://<cache_service>.<namespace>.svc:80
    proxy_url: str | None = None
    # mode: env rules' NO_PROXY unless a rule sets `noProxy`; None: webhook.patch.DEFAULT_NO_PROXY
    no_proxy: str | None = None
    # The sidecar deployment model (docs/deployment-models.md); checked by
    # webhook/server.py sidecar_config, which knows its forms. No image: pods
    # that ask for a sidecar stay centralized, with nezha.io/status saying why.
    sidecar_image: str | None = None
    sidecar_image_pull_policy: str = "IfNotPresent"
    # The data volume's sizeLimit unless a pod's nezha.io/sidecar-size says otherwise.
    sidecar_size: str = "10Gi"
    sidecar_resources: dict[str, dict[str, str]] = Field(default_factory=lambda: {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}})
    # May a pod choose `sidecar` with nezha.io/deployment? (`centralized` always may.)
    sidecar_by_annotation: bool = True
    # The sidecar's --parent; default http://<cache_service>.<namespace>.svc:80
    sidecar_parent: str | None = None
    # host -> upstream for the sidecar's --origin (a sidecar that cannot reach
    # the cluster fetches from these); a host missing here: http://<host>.
    sidecar_origins: dict[str, str] = Field(default_factory=dict)
    # "1.35": the API server's version, instead of reading it from discovery.
    kubernetes_version: str | None = None
    # `nezha webhook certs`
    webhook_service: str = "nezha-webhook"
    webhook_configuration: str = "nezha-webhook"
    tls_secret: str = "nezha-webhook-tls"
    cert_days: int = 365
    renew_days: int = 30

    @field_validator("listen")
    @classmethod
    def _hostport(cls, v: str) -> str:
        parse_hostport(v, field="listen")
        return v

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen(cls, v: str | None) -> str | None:
        if v is not None:
            parse_hostport(v, field="metrics_listen (--metrics-listen)")
        return v

    @field_validator("cache_ip")
    @classmethod
    def _cache_ip(cls, v: str | None) -> str | None:
        if v is not None:
            import ipaddress

            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"cache_ip {v!r} is not an IP address") from None
        return v

    @model_validator(mode="after")
    def _check(self) -> "WebhookSettings":
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) must be at least 1024")
        if self.rules_reload_interval <= 0 or self.tls_reload_interval <= 0:
            raise ValueError("rules_reload_interval and tls_reload_interval must be positive")
        if not 0 < self.renew_days < self.cert_days:
            raise ValueError(f"renew_days ({self.renew_days}) must be positive and below cert_days "
                             f"({self.cert_days})")
        return self

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_hostport(self.listen, field="listen")

    @property
    def metrics_addr(self) -> tuple[str, int]:
        assert self.metrics_listen is not None
        return parse_hostport(self.metrics_listen, field="metrics_listen")

    @property
    def cache_proxy_url(self) -> str:
        return self.proxy_url or f"http://{self.cache_service}.{self.namespace}.svc:80"

    @property
    def sidecar_parent_url(self) -> str:
        return self.sidecar_parent or f"http://{self.cache_service}.{self.namespace}.svc:80"
