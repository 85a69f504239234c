"""The replica secret `loraplex up` keeps per data dir (the gateway proves itself to engine
replicas with it; see `loraplex.platform.wire.auth`).

`LORAPLEX_REPLICA_SECRET` wins when set. Otherwise `<data dir>/replica_secret` holds it,
written by the platform's one secret writer (`secret_files`: 0600 from the first byte) and
read back on later runs.
"""

from __future__ import annotations

from pathlib import Path

from loraplex.platform.secret_files import read_or_create_secret, token
from loraplex.platform.settings import Settings

SECRET_FILE = "replica_secret"


def ensure_replica_secret(settings: Settings, data_dir: Path) -> str:
    """The replica secret for this data dir: the configured one, else the kept one (made on
    first use)."""
    if settings.replica_secret:
        return settings.replica_secret
    return read_or_create_secret(data_dir / SECRET_FILE, lambda: token("lpx-replica-") + "\n")
