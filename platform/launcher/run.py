"""`loraplex launcher`: the control plane's controller for Kubernetes. It reconciles every
deployment row of the database (`LORAPLEX_DATABASE_URL`) into engine resources on the cluster
with `KubernetesLauncher`, rendered for one environment and release (the same three inputs
as `python -m loraplex.infra.k8s.render`), until SIGTERM; `--once` makes one pass.

    loraplex launcher --env prod --outputs out.json --tag v1.2.0 [--kubeconfig ~/.kube/config]

Without `--kubeconfig` it uses the in-cluster service-account config. In the cluster it runs
as the `loraplex-launcher` Deployment (`infra/k8s/templates/launcher.yaml.j2`) with
`--values` (the environment's values as rendered into its ConfigMap) instead of `--env`, and
`--heartbeat`: a file touched after every pass, which its liveness probe checks.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    """Register `launcher` on the `loraplex` subparsers."""
    p = sub.add_parser("launcher", help="reconcile deployments into Kubernetes engine resources")
    values = p.add_mutually_exclusive_group(required=True)
    values.add_argument("--env", help="infra/k8s/values/<env>.yaml")
    values.add_argument("--values", help="an environment's values file (YAML or JSON)")
    p.add_argument("--outputs", required=True, help="`terraform output -json` of that env")
    p.add_argument("--tag", required=True, help="image tag of the release")
    p.add_argument("--engine-tag", default="", help="engine image tag (default: --tag)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--heartbeat", help="a file touched after every pass (for a liveness probe)")
    p.set_defaults(func=run_launcher)


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


def _values(args: argparse.Namespace) -> dict[str, Any]:
    from loraplex.infra.k8s.render import load_values

    if args.env:
        return load_values(args.env)
    import yaml  # JSON is YAML

    return yaml.safe_load(Path(args.values).read_text())


def _beat(path: str | None) -> None:
    """Touch the heartbeat file: this loop is alive (whatever the pass's outcome)."""
    if path:
        Path(path).write_text(json.dumps({"ok": True}))


def run_launcher(args: argparse.Namespace) -> int:
    """Reconcile until SIGTERM/SIGINT (or once); returns the exit code."""
    from loraplex.infra.k8s.render import Release, terraform_outputs
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
    release = Release(terraform_outputs(args.outputs), _values(args), args.tag, args.engine_tag)
    launcher = KubernetesLauncher(release, _api_client(args.kubeconfig))
    reconciler = Reconciler(launcher, make_sessionmaker(settings.database_url))
    if args.once:
        reconciler.once()
        _beat(args.heartbeat)
        return 0
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    while not done.is_set():
        try:
            reconciler.once()
        except Exception:  # noqa: BLE001 - the next pass tries again; the log says why
            log.exception("reconcile pass failed")
        _beat(args.heartbeat)
        done.wait(args.interval)
    return 0
