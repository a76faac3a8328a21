"""A kubeconfig file that points a real client at the API double.

Its own module, free of pytest, because more than tests need it: `kubectl`
and `helm` in the chart tests, `nezha` processes started by tests, and
bench/controller.py all reach the double through a file like this one.
"""

from __future__ import annotations

from pathlib import Path


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: double, cluster: {{server: "{server}"}}}}]
users: [{{name: tester, user: {{token: not-checked}}}}]
contexts: [{{name: double, context: {{cluster: double, user: tester}}}}]
current-context: double
""")
    return path
