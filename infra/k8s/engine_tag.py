"""The engine image's tag: a hash of the content of what the engine runs, not the release tag.

A release that changes only the API, the console or the worker leaves this tag as it was, so
the engine pod template renders the same and Kubernetes rolls no GPU replica (a rollout
starts only when a Deployment's pod template changes). The inputs are the engine's packages,
the few platform modules the engine and its replica agent import (a test derives them from
the imports and checks they are all here), and the image's build files.

    python -m loraplex.infra.k8s.engine_tag            # prints e.g. engine-3f2a9c01d4e5
"""

from __future__ import annotations

import hashlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Folders and files (relative to the repository root) whose content the engine image runs.
ENGINE_SOURCES = (
    "adapters",
    "moe",
    "loader",
    "platform/engine",
    "platform/engine_spec",
    "platform/tokenizing",
    "platform/wire",
    "platform/errors.py",
    "platform/graceful.py",
    "platform/transport_cycles.py",
    "platform/http_errors.py",
    "platform/settings.py",
    "platform/gateway/__init__.py",
    "platform/gateway/replica_agent.py",
    "platform/gateway/replicas.py",
    "infra/docker/engine.Dockerfile",
    "infra/docker/engine.Dockerfile.dockerignore",
    "infra/docker/engine_check.py",
    "pyproject.toml",
    "setup.py",
)
_SKIP = ("__pycache__",)


def inputs(repo: Path = REPO) -> list[Path]:
    """Every file the tag hashes, relative to `repo`, sorted."""
    found: list[Path] = []
    for source in ENGINE_SOURCES:
        path = repo / source
        if path.is_file():
            found.append(path.relative_to(repo))
        elif path.is_dir():
            found += [
                p.relative_to(repo)
                for p in path.rglob("*")
                if p.is_file() and not any(s in p.parts for s in _SKIP) and p.suffix != ".pyc"
            ]
        else:
            raise FileNotFoundError(f"engine image input {source} is missing from {repo}")
    return sorted(found)


def engine_tag(repo: Path = REPO) -> str:
    """`engine-` and the first 12 hex digits of SHA-256 over every input's path and bytes."""
    digest = hashlib.sha256()
    for rel in inputs(repo):
        digest.update(rel.as_posix().encode() + b"\0")
        digest.update((repo / rel).read_bytes() + b"\0")
    return f"engine-{digest.hexdigest()[:12]}"


if __name__ == "__main__":
    print(engine_tag())
