"""The webhook's HTTPS server: POST /mutate and GET /healthz on one TLS port;
GET /metrics on a plain HTTP port of its own (`metrics_listen`), for Prometheus.

Bad requests (not JSON, oversize, nested deeper than MAX_DEPTH, not an
AdmissionReview v1) get a 400 whose one-line body says what is wrong; nothing
reaches the client as a 500 with a traceback. Objects the webhook cannot patch
are allowed unchanged (review.py): the server fails open.

Files change under a running server: the rules file (a mounted ConfigMap) and
the serving certificate (a mounted Secret). Both are polled by stat signature;
a rules file that does not parse is logged and the previous rules stay; a
certificate pair is read once and loaded into a scratch context before the
same bytes go into the live one, so a half-written pair never reaches it. The
live SSLContext is updated in place with `load_cert_chain`, which applies to
every new handshake, because aiohttp's site holds on to the context it was
started with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import structlog
from aiohttp import web

from nezha.config import WebhookSettings
from nezha.errors import ConfigError, ReviewError, RunError
from webhook.metrics import WebhookMetrics, outcome_of
from webhook.patch import DEFAULT_NO_PROXY
from webhook.rules import Rule, RuleError, parse_rules
from webhook.review import review
from webhook.sidecar import MIN_SIZE, SidecarConfig, parse_version, quantity_bytes

log = structlog.get_logger("nezha.webhook")

WEBHOOK: web.AppKey["Webhook"] = web.AppKey("webhook")
# A review of a pod nests under 25 levels (its managedFields are the deepest).
# Deeper bodies are refused before any code walks them, so nothing later can
# hit the interpreter's recursion limit on a body the parser accepted.
MAX_DEPTH = 100


def _deeper_than(value: Any, limit: int) -> bool:
    """True when a parsed JSON value nests arrays or objects more than `limit` levels. Iterative."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in node)
    return False


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class RulesFile:
    """The rules, re-read when the file's stat signature changes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.signature: tuple[int, int, int] | None = None
        self.rules: tuple[Rule, ...] = ()
        self.error: str | None = None

    def load_initial(self) -> None:
        """First load: a file that is missing or does not parse stops start-up."""
        self.signature = _signature(self.path)
        try:
            self.rules = parse_rules(self.path.read_text())
        except OSError as e:
            raise ConfigError(f"rules file {self.path}: {e.strerror}") from e
        except RuleError as e:
            raise ConfigError(f"rules file {self.path}: {e}") from e

    def refresh(self) -> bool:
        """Reload if changed; True when new rules were adopted."""
        sig = _signature(self.path)
        if sig == self.signature:
            return False
        self.signature = sig
        try:
            rules = parse_rules(self.path.read_text())
        except (OSError, RuleError) as e:
            self.error = f"{self.path}: {getattr(e, 'strerror', None) or e}"
            log.error("rules_reload_failed", path=str(self.path), error=str(self.error), kept=len(self.rules))
            return False
        self.rules, self.error = rules, None
        log.info("rules_reloaded", path=str(self.path), rules=[r.name for r in rules])
        return True


@contextlib.contextmanager
def _pem_paths(*blobs: bytes) -> Iterator[list[str]]:
    """Paths that read back exactly `blobs`, for APIs that take only file names (load_cert_chain).

    memfds on Linux: nothing touches a disk, and a read-only root file system
    is fine; elsewhere files in a private temporary directory.
    """
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:
            for blob in blobs:
                fds.append(os.memfd_create("nezha-pem", os.MFD_CLOEXEC))
                with open(fds[-1], "wb", closefd=False) as f:
                    f.write(blob)
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="nezha-pem-") as folder:
        paths = []
        for i, blob in enumerate(blobs):
            path = os.path.join(folder, str(i))
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(blob)
            paths.append(path)
        yield paths


class ServingCert:
    """A server SSLContext whose certificate pair follows the files.

    Each file is read once per load, and the scratch check and the live
    context load the same bytes: a pair swapped on disk between the two can
    never reach the live context half old, half new.
    """

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = Path(cert), Path(key)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.signature: tuple[Any, Any] | None = None

    def _sig(self) -> tuple[Any, Any]:
        return (_signature(self.cert), _signature(self.key))

    def load_initial(self) -> None:
        self.signature = self._sig()
        try:
            with _pem_paths(self.cert.read_bytes(), self.key.read_bytes()) as (cert, key):
                self.context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"tls_cert {self.cert} / tls_key {self.key}: {e}") from e

    def refresh(self) -> bool:
        sig = self._sig()
        if sig == self.signature:
            return False
        try:
            cert_pem, key_pem = self.cert.read_bytes(), self.key.read_bytes()
            with _pem_paths(cert_pem, key_pem) as (cert, key):
                # A failed load_cert_chain can leave a context with the new
                # certificate and the old key, so only a pair that loaded into
                # a scratch context goes into the live one.
                scratch = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                scratch.load_cert_chain(cert, key)
                self.context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            # Maybe half-written; the next poll tries again because the signature is not kept.
            log.warning("tls_reload_failed", cert=str(self.cert), key=str(self.key), error=str(e))
            return False
        self.signature = sig
        log.info("tls_reloaded", cert=str(self.cert))
        return True


def kubernetes_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a `kubernetes_version` setting such as 1.35 or v1.29.3; ConfigError when not one."""
    if text is None:
        return None
    parts = text.strip().lstrip("v").split(".")
    version = parse_version(*(parts + [""])[:2])
    if version is None:
        raise ConfigError(f"kubernetes_version ({text!r}) must be MAJOR.MINOR, such as 1.35")
    return version


def sidecar_config(settings: WebhookSettings, server_version: tuple[int, int] | None) -> SidecarConfig:
    """The settings' sidecar part, checked (ConfigError naming the field): what webhook/sidecar.py builds from."""
    size = quantity_bytes(settings.sidecar_size)
    if size is None or size < MIN_SIZE:
        raise ConfigError(f"sidecar_size ({settings.sidecar_size!r}) must be a Kubernetes quantity of at least 1Gi, "
                          "such as 10Gi")
    for part, values in settings.sidecar_resources.items():
        if part not in ("requests", "limits"):
            raise ConfigError(f"sidecar_resources has {part!r}; only requests and limits")
        for resource, amount in values.items():
            if not isinstance(amount, str) or not amount:
                raise ConfigError(f"sidecar_resources.{part}.{resource} ({amount!r}) must be a quantity string")
    if settings.sidecar_image_pull_policy not in ("Always", "IfNotPresent", "Never"):
        raise ConfigError(f"sidecar_image_pull_policy ({settings.sidecar_image_pull_policy!r}) must be Always, "
                          "IfNotPresent or Never")
    return SidecarConfig(image=settings.sidecar_image, parent=settings.sidecar_parent_url,
                         size=settings.sidecar_size, resources=settings.sidecar_resources,
                         by_annotation=settings.sidecar_by_annotation, origins=dict(settings.sidecar_origins),
                         pull_policy=settings.sidecar_image_pull_policy, server_version=server_version)


class Webhook:
    """Request handlers over the current rules and cache IP."""

    def __init__(self, *, settings: WebhookSettings, rules: RulesFile | None = None,
                 cert: ServingCert | None = None) -> None:
        self.settings = settings
        self.rules_file = rules
        self.static_rules: tuple[Rule, ...] = ()
        self.cert = cert
        # Set by --cache-ip, or kept current by the Service watcher.
        self.cache_ip: str | None = settings.cache_ip
        # NO_PROXY for env-mode rules without their own noProxy: the setting
        # when one was given (flag, NEZHA_NO_PROXY, config file), else the
        # webhook's default, which keeps the private ranges direct as well.
        self.no_proxy = settings.no_proxy or DEFAULT_NO_PROXY
        # Keeps cache_ip current (the Service watcher, set by the command). It
        # runs only while some rule leaves `ip` out and no --cache-ip is given:
        # started at start-up, or by the rules reload that first needs it.
        self.discovery: Callable[[], Awaitable[None]] | None = None
        self._discovery_task: asyncio.Task | None = None
        self.metrics = WebhookMetrics()
        # The sidecar model's settings and the API server's version (the
        # setting, else read from discovery by `version_discovery`, set by the
        # command: until it is known, pods asking for a sidecar stay centralized).
        self.sidecar = sidecar_config(settings, kubernetes_version(settings.kubernetes_version))
        self.version_discovery: Callable[[], Awaitable[None]] | None = None

    def set_server_version(self, version: tuple[int, int] | None) -> None:
        """Adopt the API server's version (the sidecar config is immutable: a new one is made)."""
        if version != self.sidecar.server_version:
            self.sidecar = dataclasses.replace(self.sidecar, server_version=version)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.rules_file.rules if self.rules_file is not None else self.static_rules

    async def mutate(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            return await self._mutate(request, started)
        except Exception:
            self.metrics.admissions.labels("error").inc()  # answered 500 by no_tracebacks
            raise
        finally:
            self.metrics.duration.observe(time.perf_counter() - started)

    async def _mutate(self, request: web.Request, started: float) -> web.Response:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._bad(f"body of {request.content_length} bytes exceeds max_body_bytes ({limit})")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._bad(f"body exceeds max_body_bytes ({limit})")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return self._bad(f"body is not JSON: {e}")
        except RecursionError:  # the parser's own limit, far above MAX_DEPTH
            return self._bad(f"body nests arrays or objects more than {MAX_DEPTH} levels deep")
        if _deeper_than(body, MAX_DEPTH):
            return self._bad(f"body nests arrays or objects more than {MAX_DEPTH} levels deep")
        try:
            decision = review(body, rules=self.rules, cache_ip=self.cache_ip,
                              proxy_url=self.settings.cache_proxy_url, no_proxy=self.no_proxy, sidecar=self.sidecar)
        except ReviewError as e:
            return self._bad(str(e))
        if decision.fallback is not None:
            log.warning("sidecar_fallback", uid=decision.uid, kind=decision.kind, namespace=decision.namespace,
                        name=decision.name, why=decision.fallback)
        log.info("review_completed", uid=decision.uid, kind=decision.kind, namespace=decision.namespace,
                 name=decision.name, rules=decision.rules, ops=len(decision.ops), warnings=decision.warnings,
                 status=decision.status,
                 ms=round((time.perf_counter() - started) * 1000, 3))
        self.metrics.admissions.labels(outcome_of(decision)).inc()
        return web.json_response(decision.response)

    def _bad(self, message: str) -> web.Response:
        message = " ".join(message.split())[:500]
        log.warning("review_rejected", status=400, error=message)
        self.metrics.admissions.labels("invalid").inc()
        return web.Response(status=400, text=message + "\n")

    async def healthz(self, request: web.Request) -> web.Response:
        rules_error = self.rules_file.error if self.rules_file is not None else None
        return web.json_response({"ok": True, "rules": [r.name for r in self.rules], "rules_error": rules_error,
                                  "cache_ip": self.cache_ip})

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready only when an admitted pod would get its aliases: rules loaded, and the cache IP
        known if a rule needs it. An unready webhook is out of its Service, so the API server's call
        fails and the pod is admitted unpatched (failurePolicy Ignore) either way, but a rollout waits
        for ready pods instead of replacing working ones with blind ones."""
        why = None
        if self.rules_file is not None and self.rules_file.error and not self.rules:
            why = f"no usable rules: {self.rules_file.error}"
        elif not self.rules:
            why = "no rules loaded"
        else:
            needing = [r.name for r in self.rules if r.needs_cache_ip]
            if needing and self.cache_ip is None:
                why = (f"rules {needing} need the cache Service's IP and it is not known yet "
                       f"(Service {self.settings.cache_service} in {self.settings.namespace})")
        body = {"ready": why is None, "rules": [r.name for r in self.rules], "cache_ip": self.cache_ip}
        if why:
            body["why"] = why
        return web.json_response(body, status=200 if why is None else 503)

    def start_discovery_if_needed(self) -> None:
        """Start following the cache Service when a rule needs its IP and nothing else provides it."""
        if self.settings.cache_ip is not None:
            return
        needing = [r.name for r in self.rules if r.needs_cache_ip]
        if not needing or self._discovery_task is not None and not self._discovery_task.done():
            return
        if self.discovery is None:
            log.error("cache_ip_unavailable", rules=needing,
                      error="rules without ip need the cache Service IP, and there is no --cache-ip and no "
                            "Service watch (watch_service is off); their aliases are skipped")
            return
        log.info("service_watch_starting", rules=needing)
        self._discovery_task = asyncio.create_task(self.discovery())

    async def poll_files(self) -> None:
        """Follow the rules file and certificate; tiny on purpose, the work is in refresh()."""
        next_rules = next_tls = 0.0
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self.rules_file is not None and now >= next_rules:
                if self.rules_file.refresh():
                    self.start_discovery_if_needed()
                next_rules = now + self.settings.rules_reload_interval
            if self.cert is not None and now >= next_tls:
                self.cert.refresh()
                next_tls = now + self.settings.tls_reload_interval
            await asyncio.sleep(min(self.settings.rules_reload_interval, self.settings.tls_reload_interval))


@web.middleware
async def no_tracebacks(request: web.Request, handler):
    """An unexpected error is logged once and answered with one line, never a traceback page."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:  # last resort: the webhook must answer
        log.exception("request_failed", path=request.path)
        return web.Response(status=500, text=f"internal error: {type(e).__name__}\n")


def build_app(webhook: Webhook) -> web.Application:
    app = web.Application(client_max_size=webhook.settings.max_body_bytes, middlewares=[no_tracebacks])
    app.router.add_post("/mutate", webhook.mutate)
    app.router.add_get("/healthz", webhook.healthz)
    app.router.add_get("/readyz", webhook.readyz)
    app[WEBHOOK] = webhook

    async def lifecycle(app: web.Application):
        tasks = [asyncio.create_task(webhook.poll_files())]
        webhook.start_discovery_if_needed()
        if webhook.version_discovery is not None:
            tasks.append(asyncio.create_task(webhook.version_discovery()))
        yield
        if webhook._discovery_task is not None:
            tasks.append(webhook._discovery_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    app.cleanup_ctx.append(lifecycle)
    return app


def build_webhook(settings: WebhookSettings) -> Webhook:
    """Load rules and certificate from the files named in settings; errors name the field."""
    if settings.rules is None:
        raise ConfigError("rules: a rules file is required (--rules)")
    if settings.tls_cert is None or settings.tls_key is None:
        raise ConfigError("tls_cert and tls_key are required (--tls-cert, --tls-key)")
    rules = RulesFile(settings.rules)
    rules.load_initial()
    cert = ServingCert(settings.tls_cert, settings.tls_key)
    cert.load_initial()
    return Webhook(settings=settings, rules=rules, cert=cert)


async def start(webhook: Webhook) -> web.AppRunner:
    """Serve over TLS on settings.listen; returns the runner (cleanup() stops it)."""
    assert webhook.cert is not None
    runner = web.AppRunner(build_app(webhook), access_log=None, handle_signals=False)
    await runner.setup()
    host, port = webhook.settings.listen_addr
    site = web.TCPSite(runner, host, port, ssl_context=webhook.cert.context, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise RunError(f"cannot listen on {webhook.settings.listen} (--listen): {e.strerror or e}") from e
    log.info("webhook_listening", listen=webhook.settings.listen, rules=[r.name for r in webhook.rules],
             cache_ip=webhook.cache_ip)
    return runner


async def start_metrics(webhook: Webhook) -> web.AppRunner | None:
    """/metrics over plain HTTP on settings.metrics_listen (Prometheus scrapes pods without the webhook's CA);
    None when it is not set."""
    if webhook.settings.metrics_listen is None:
        return None

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=webhook.metrics.render(), headers={"Content-Type": webhook.metrics.content_type})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, port = webhook.settings.metrics_addr
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError as e:
        await runner.cleanup()
        raise RunError(f"cannot listen on {webhook.settings.metrics_listen} (--metrics-listen): "
                       f"{e.strerror or e}") from e
    log.info("metrics_listening", listen=webhook.settings.metrics_listen)
    return runner


async def serve(settings: WebhookSettings, *, webhook: Webhook | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or `stop` is set)."""
    webhook = webhook or build_webhook(settings)
    runner = await start(webhook)
    try:
        metrics = await start_metrics(webhook)
    except RunError:
        await runner.cleanup()
        raise
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        log.info("webhook_stopping", listen=settings.listen)
        if metrics is not None:
            await metrics.cleanup()
        await runner.cleanup()
