"""`nezha webhook` and `nezha webhook certs`: the admission webhook's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from nezha.config.base import Kubeconfig, NezhaSettings, kubeconfig_field
from nezha.config.flags import Flag
from nezha.values import parse_hostport


class WebhookSettings(NezhaSettings):
    """The admission webhook (`nezha webhook`)."""

    listen: Annotated[str, Flag(only=("webhook",))] = Field("127.0.0.1:8443", description="HOST:PORT to serve on")
    # HOST:PORT serving /metrics over plain HTTP (webhook/metrics.py); none: no listener.
    metrics_listen: Annotated[str | None, Flag(only=("webhook",))] = Field(None, description=(
        "HOST:PORT serving /metrics over plain HTTP (default: none)"))
    tls_cert: Annotated[Path | None, Flag(only=("webhook",))] = Field(None, description=(
        "serving certificate (PEM); re-read when it changes"))
    tls_key: Annotated[Path | None, Flag(only=("webhook",))] = Field(None, description="its private key (PEM)")
    rules: Annotated[Path | None, Flag(only=("webhook",))] = Field(None, description=(
        "rules file (the ConfigMap's config value); re-read when it changes"))
    cache_ip: Annotated[str | None, Flag(only=("webhook",))] = Field(None, description=(
        "address for rules without ip; default: watch the cache Service (only while some rule leaves ip out)"))
    cache_service: Annotated[str, Flag(only=("webhook",))] = Field("nezha-cache", description="cache Service name")
    namespace: Annotated[str, Flag()] = Field("nezha", description=(
        "Nezha's namespace: the cache Service's, and the webhook's Service and Secret's"))
    max_body_bytes: int = 3 * 1024 * 1024
    rules_reload_interval: float = 2.0
    # How often the serving certificate and key files are checked for a renewed pair.
    tls_reload_interval: float = 10.0
    # Learn the cache Service ClusterIP from the API (in-cluster or kubeconfig)
    # while some rule leaves `ip` out and --cache-ip is not given.
    watch_service: bool = True
    kubeconfig: Kubeconfig = kubeconfig_field()
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
    webhook_service: Annotated[str, Flag(name="--service", only=("webhook certs",))] = Field("nezha-webhook", description=(
        "webhook Service name"))
    webhook_configuration: Annotated[str, Flag(only=("webhook certs",))] = Field("nezha-webhook", description=(
        "MutatingWebhookConfiguration to patch"))
    tls_secret: Annotated[str, Flag(name="--secret", only=("webhook certs",))] = Field("nezha-webhook-tls", description=(
        "Secret to store the pair in"))
    cert_days: Annotated[int, Flag(name="--days", only=("webhook certs",))] = Field(365, description=(
        "validity of a new serving certificate, in days"))
    renew_days: Annotated[int, Flag(only=("webhook certs",))] = Field(30, description="renew when fewer days remain")

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
