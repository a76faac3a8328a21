"""Reaching the Kubernetes API: one way for every component that needs it.

A kubeconfig when one is named (`--kubeconfig`, or `KUBECONFIG` read by the
settings), else the pod's service account. Failing to find either is a
configuration error (exit code 2), not something to retry: an API server
that does not answer yet is retried by the caller, a missing credential
never appears by itself.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio import client, config

from nezha.errors import ConfigError


async def api_client(*, kubeconfig: Path | None = None, hint: str = "pass --kubeconfig") -> client.ApiClient:
    """An ApiClient from a kubeconfig file, else from the pod's service account.

    `hint` ends the error message: what the command's user can do instead.
    """
    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as e:
        where = f"kubeconfig {kubeconfig}" if kubeconfig is not None else "the in-cluster service account"
        raise ConfigError(f"cannot reach the Kubernetes API through {where}: {e}; outside a cluster {hint}") from e
    return client.ApiClient(configuration=configuration)
