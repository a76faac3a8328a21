"""The Kubernetes API double's failures: a Status object answer, and the
error its handlers raise to send one (testkit/kubeapi/server.py)."""

from __future__ import annotations

from aiohttp import web


def status(code: int, reason: str, message: str, *, details: dict | None = None) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return web.json_response(body, status=code)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details
