"""`nezha webhook` (serve admission reviews) and `nezha webhook certs` (mint and rotate its TLS)."""

from __future__ import annotations

import argparse
import asyncio

from nezha.config import WebhookSettings, load
from nezha.config.flags import add_settings, given
from nezha.logs import configure


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("webhook", help="run the admission webhook (HTTPS)")
    add_settings(p, WebhookSettings, command="webhook")
    p.set_defaults(func=run_webhook)
    sub2 = p.add_subparsers(dest="webhook_command", metavar="SUBCOMMAND")
    c = sub2.add_parser("certs", help="create or renew the webhook's CA and serving certificate in the cluster")
    add_settings(c, WebhookSettings, command="webhook certs")
    c.set_defaults(func=run_certs)


def run_webhook(args: argparse.Namespace) -> int:
    from webhook.server import build_webhook, serve

    settings = load(WebhookSettings, config_file=args.config, flags=given(args))
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

    settings = load(WebhookSettings, config_file=args.config, flags=given(args))
    configure(level=settings.log_level)

    async def main() -> str:
        api = await api_client(kubeconfig=settings.kubeconfig)
        try:
            return await ensure_certs(api=api, settings=settings)
        finally:
            await api.close()

    print(asyncio.run(main()))
    return 0
