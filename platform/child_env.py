"""The environment each child of `loraplex up` gets: its settings, and only its secrets.

Every non-secret setting goes to every child as a `LORAPLEX_*` variable (limits, addresses,
queue names: harmless to share). Each secret goes only to the roles listed in
`SECRET_SETTINGS`: the engine replica never sees the database password or the admin key, the
worker never sees the admin key. `LORAPLEX_*` variables inherited from `up`'s own environment
are dropped first, so nothing leaks around the list. A setting whose name looks secret and is
not listed goes to no child (add it to the list to hand it on).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from loraplex.platform.settings import Settings

ROLES = ("api", "worker", "engine")

SECRET_SETTINGS: dict[str, frozenset[str]] = {
    "s3_endpoint_url": frozenset(ROLES),  # not secret, but its name ends in _url
    "admin_key": frozenset({"api"}),
    "database_url": frozenset({"api", "worker"}),
    "broker_url": frozenset({"api", "worker"}),
    "redis_url": frozenset({"api", "worker"}),
    "s3_access_key": frozenset({"api", "worker", "engine"}),
    "s3_secret_key": frozenset({"api", "worker", "engine"}),
    # The gateway <-> replica shared secret (#13 item 3).
    "replica_secret": frozenset({"api", "engine"}),
}
_SECRET_WORDS = ("secret", "password", "key", "token", "credential", "_url")


def is_secret(name: str) -> bool:
    """True for settings that must reach only the roles that need them."""
    return name in SECRET_SETTINGS or any(w in name for w in _SECRET_WORDS)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float | Path):
        return str(value)
    return json.dumps(value, default=str)


def child_env(
    settings: Settings, role: str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` (default: this process's environment) without any `LORAPLEX_*` variable, plus
    the settings `role` may see."""
    if role not in ROLES:
        raise ValueError(f"unknown child role {role!r}; one of {', '.join(ROLES)}")
    env = {
        k: v for k, v in (os.environ if base is None else base).items()
        if not k.startswith("LORAPLEX_")
    }  # fmt: skip
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if is_secret(name) and role not in SECRET_SETTINGS.get(name, frozenset()):
            continue
        env[f"LORAPLEX_{name.upper()}"] = _text(value)
    return env
