"""`nezha webhook` (serve admission reviews) and `nezha webhook certs` (mint and rotate its TLS)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from nezha.config import WebhookSettings, load
from nezha.logs import configure


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("webhook", help="run the admission webhook (HTTPS)")
    p.add_argument("--listen", help="HOST:PORT to serve on (default 127.0.0.1:8443)")
    p.add_argument("--metrics-listen", help="HOST:PORT serving /metrics over plain HTTP (default: none)")
    p.add_argument("--tls-cert", type=Path, help="serving certificate (PEM); re-read when it changes")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument("--rules", type=Path, help="rules file (the ConfigMap's config value); re-read when it changes")
    p.add_argument("--cache-ip", help="address for rules without ip; default: watch the cache Service "
                   "(only while some rule leaves ip out)")
    p.add_argument("--cache-service", help="cache Service name (default nezha-cache)")
    p.add_argument("--namespace", help="Nezha's namespace (default nezha)")
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: NEZHA_KUBECONFIG or KUBECONFIG, else the "
                   "pod's service account)")
    p.add_argument("--config", type=Path, help="YAML file of settings")
    p.add_argument("--log-level")
    p.set_defaults(func=run_webhook)
    sub2 = p.add_subparsers(dest="webhook_command", metavar="SUBCOMMAND")
    c = sub2.add_parser("certs", help="create or renew the webhook's CA and serving certificate in the cluster")
    c.add_argument("--namespace", help="namespace of the Service and Secret (default nezha)")
    c.add_argument("--service", dest="webhook_service", help="webhook Service name (default nezha-webhook)")
    c.add_argument("--secret", dest="tls_secret", help="Secret to store the pair in (default nezha-webhook-tls)")
    c.add_argument("--webhook-configuration", help="MutatingWebhookConfiguration to patch (default nezha-webhook)")
    c.add_argument("--days", dest="cert_days", type=int, help="validity of a new serving certificate (default 365)")
    c.add_argument("--renew-days", type=int, help="renew when fewer days remain (default 30)")
    c.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: NEZHA_KUBECONFIG or KUBECONFIG, else the "
                   "pod's service account)")
    c.add_argument("--config", type=Path, help="YAML file of settings")
    c.add_argument("--log-level")
    c.set_defaults(func=run_certs)


def _flags(args: argparse.Namespace, names: list[str]) -> dict:
    return {n: getattr(args, n, None) for n in names}


def run_webhook(args: argparse.Namespace) -> int:
    from webhook.server import build_webhook, serve

    settings = load(WebhookSettings, config_file=args.config, flags=_flags(
        args, ["listen", "metrics_listen", "tls_cert", "tls_key", "rules", "cache_ip", "cache_service", "namespace", "kubeconfig",
               "log_level"]))
    configure(level=settings.log_level)
    webhook = build_webhook(settings)

    async def main() -> None:
        api = None
        if settings.cache_ip is None and settings.watch_service:
            from webhook.discovery import api_client, service_follower

            if any(r.needs_cache_ip for r in webhook.rules):
                # Checked now so that a webhook that could never learn the IP
                # stops at start with exit code 2, naming the flags to pass.
                api = await api_client(kubeconfig=settings.kubeconfig)
            # Runs only while a rule leaves `ip` out (see Webhook.start_discovery_if_needed).
            webhook.discovery = service_follower(settings=settings, api=api,
                                                 on_ip=lambda ip: setattr(webhook, "cache_ip", ip))
        if settings.sidecar_image and settings.kubernetes_version is None:
            from webhook.discovery import version_follower

            # Native sidecars need 1.29: until the version is read, sidecar pods stay centralized.
            webhook.version_discovery = version_follower(settings=settings, api=api,
                                                         on_version=webhook.set_server_version)
        try:
            await serve(settings, webhook=webhook)
        finally:
            if api is not None:
                await api.close()

    asyncio.run(main())
    return 0


def run_certs(args: argparse.Namespace) -> int:
    from nezha.kube import api_client as kube_api_client
    from webhook.certs import ensure_certs

    async def api_client(*, kubeconfig):
        return await kube_api_client(kubeconfig=kubeconfig, hint="pass --kubeconfig (or set KUBECONFIG)")

    settings = load(WebhookSettings, config_file=args.config, flags=_flags(
        args, ["namespace", "webhook_service", "tls_secret", "webhook_configuration", "cert_days", "renew_days",
               "kubeconfig", "log_level"]))
    configure(level=settings.log_level)

    async def main() -> str:
        api = await api_client(kubeconfig=settings.kubeconfig)
        try:
            return await ensure_certs(api=api, settings=settings)
        finally:
            await api.close()

    print(asyncio.run(main()))
    return 0
