"""`nezha ca init`: where the CA for HTTPS dataset hosts is kept, in a cluster or in a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field, model_validator

from nezha.config.base import QUIET_LOG_HELP, Kubeconfig, NezhaSettings, kubeconfig_field
from nezha.config.flags import Flag
from nezha.trust_bundle import CONFIGMAP


class CaInitSettings(NezhaSettings):
    """Exactly one of `namespace` (the cluster) and `local` (a folder)."""

    flag_help: ClassVar[dict[str, str]] = QUIET_LOG_HELP

    namespace: Annotated[str | None, Flag(metavar="NS", exclusive="where")] = Field(None, description=(
        f"keep it in the cluster: the key in Secret nezha-ca-key, the certificate and the pods' bundle in "
        f"ConfigMap {CONFIGMAP}"))
    local: Annotated[Path | None, Flag(metavar="DIR", exclusive="where")] = Field(None, description=(
        "keep it in DIR: ca.crt and ca.key (created if missing)"))
    kubeconfig: Kubeconfig = kubeconfig_field()

    @model_validator(mode="after")
    def _one_place(self) -> "CaInitSettings":
        if (self.namespace is None) == (self.local is None):
            which = "both are set" if self.namespace is not None else "neither is set"
            raise ValueError(f"pass one of --namespace NS and --local DIR (or NEZHA_NAMESPACE, NEZHA_LOCAL, or "
                             f"namespace or local in --config): the CA is kept in a cluster or in a folder; "
                             f"{which}")
        return self
