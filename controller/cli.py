"""`nezha controller`: keep the cache cluster's ring equal to its ready pods."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from nezha.config import ControllerSettings, load
from nezha.logs import configure

FLAGS = ["health_listen", "namespace", "statefulset", "redis_url", "identity", "kubeconfig", "lease_name", "peer_address",
         "peer_port", "cluster_token_file", "publish_ca", "log_level"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("controller", help="run the controller of a cache StatefulSet (ring, scale, prefetch)")
    p.add_argument("--namespace", help="namespace of the cache StatefulSet (required)")
    p.add_argument("--statefulset", help="name of the cache StatefulSet (required)")
    p.add_argument("--redis-url", help="the shared index, redis://[:PASSWORD@]HOST:PORT/DB (required)")
    p.add_argument("--identity", help="this replica's name in the leader Lease (default: the host name)")
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig; default: KUBECONFIG, else the service account")
    p.add_argument("--lease-name", help="coordination.k8s.io Lease the replicas elect a leader with "
                   "(default nezha-controller)")
    p.add_argument("--peer-address", choices=["dns", "pod-ip"],
                   help="how peers reach a node: <pod>.<service>.<ns>.svc (dns, default) or the pod IP")
    p.add_argument("--peer-port", type=int, help="node port when the container has no port named http "
                   "(default 8080)")
    p.add_argument("--cluster-token-file", type=Path, help="file holding the nodes' cluster token")
    p.add_argument("--publish-ca", action="store_true", default=None,
                   help="keep a copy of ConfigMap nezha-ca (the CA bundle from `nezha ca init`) in every "
                   "namespace, for pods of tls: true rules to mount (default: off)")
    p.add_argument("--health-listen", help="HOST:PORT answering /healthz and /readyz for probes, and /metrics "
                   "(default: none)")
    p.add_argument("--config", type=Path, help="YAML file of settings")
    p.add_argument("--log-level")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from controller.run import run_controller

    settings = load(ControllerSettings, config_file=args.config,
                    flags={n: getattr(args, n, None) for n in FLAGS})
    configure(level=settings.log_level)
    asyncio.run(run_controller(settings))
    return 0
