"""The replica secret `loraplex up` keeps per data dir (the gateway proves itself to engine
replicas with it; see `loraplex.platform.wire.auth`).

`LORAPLEX_REPLICA_SECRET` wins when set. Otherwise `<data dir>/replica_secret` holds it,
created readable by its owner only from the first byte (`O_CREAT | O_EXCL`, mode 0600: never
written first and chmod-ed after), and read back on later runs.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from loraplex.platform.settings import Settings

SECRET_FILE = "replica_secret"


def ensure_replica_secret(settings: Settings, data_dir: Path) -> str:
    """The replica secret for this data dir: the configured one, else the kept one (made on
    first use)."""
    if settings.replica_secret:
        return settings.replica_secret
    path = data_dir / SECRET_FILE
    value = "lpx-replica-" + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        kept = path.read_text(encoding="utf-8").strip()
        if not kept:
            raise RuntimeError(f"{path} is empty: remove it to make a new replica secret") from None
        return kept
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")
    return value
