"""`loraplex launcher`: the control plane's controller for Kubernetes. It reconciles every
deployment row of the database (`LORAPLEX_DATABASE_URL`) into engine resources on the cluster
with `KubernetesLauncher`, rendered for one environment and release (the same three inputs
as `python -m loraplex.infra.k8s.render`), until SIGTERM; `--once` makes one pass.

    loraplex launcher --env prod --outputs out.json --tag v1.2.0 [--kubeconfig ~/.kube/config]

Without `--kubeconfig` it uses the in-cluster service-account config.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    """Register `launcher` on the `loraplex` subparsers."""
    p = sub.add_parser("launcher", help="reconcile deployments into Kubernetes engine resources")
    p.add_argument("--env", required=True, help="infra/k8s/values/<env>.yaml")
    p.add_argument("--outputs", required=True, help="`terraform output -json` of that env")
    p.add_argument("--tag", required=True, help="image tag of the release")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.set_defaults(func=run_launcher)


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


def run_launcher(args: argparse.Namespace) -> int:
    """Reconcile until SIGTERM/SIGINT (or once); returns the exit code."""
    from loraplex.infra.k8s.render import Release, load_values, terraform_outputs
    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.launcher.k8s import KubernetesLauncher
    from loraplex.platform.launcher.reconcile import Reconciler
    from loraplex.platform.settings import Settings

    logging.basicConfig(level=logging.INFO)
    settings = Settings()
    if not settings.database_url:
        raise SystemExit(
            "loraplex launcher: set LORAPLEX_DATABASE_URL (the deployments live there)"
        )
    release = Release(terraform_outputs(args.outputs), load_values(args.env), args.tag)
    launcher = KubernetesLauncher(release, _api_client(args.kubeconfig))
    reconciler = Reconciler(launcher, make_sessionmaker(settings.database_url))
    if args.once:
        reconciler.once()
        return 0
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    while not done.is_set():
        try:
            reconciler.once()
        except Exception:  # noqa: BLE001 - the next pass tries again; the log says why
            log.exception("reconcile pass failed")
        done.wait(args.interval)
    return 0
