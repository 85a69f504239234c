"""Launchers: start, scale and stop the engine replicas of a platform deployment, and read
their state back. `LocalLauncher` runs them as processes on this machine (`loraplex up`);
`KubernetesLauncher` renders and applies their Kubernetes resources. Both build the engine's
command line from the deployment row with `engine_spec.engine_args_for_deployment`."""

from loraplex.platform.launcher.base import (
    READY,
    STARTING,
    STOPPED,
    DeploymentStatus,
    Launcher,
    ReplicaStatus,
)

__all__ = [
    "READY",
    "STARTING",
    "STOPPED",
    "DeploymentStatus",
    "Launcher",
    "ReplicaStatus",
]
