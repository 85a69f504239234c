"""Replicas are reached with a secret and on an internal address (issue 13, item 3): `up`
keeps the secret per data dir in a file that is owner-only from its creation, and starts its
replica on `replica_host`, never on the API's public `host`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from loraplex.platform.launcher.local import replica_socket
from loraplex.platform.replica_secret import SECRET_FILE, ensure_replica_secret
from loraplex.platform.settings import Settings


def test_secret_is_made_once_owner_only(tmp_path: Path) -> None:
    settings = Settings(replica_secret=None)
    old = os.umask(0)  # even a permissive umask cannot widen it
    try:
        first = ensure_replica_secret(settings, tmp_path)
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / SECRET_FILE).stat().st_mode)
    assert mode == 0o600 and len(first) > 40
    assert ensure_replica_secret(settings, tmp_path) == first  # kept across runs
    assert ensure_replica_secret(Settings(replica_secret="given"), tmp_path) == "given"


def test_replica_address_defaults_to_loopback_whatever_the_api_host() -> None:
    assert Settings().replica_host == "127.0.0.1"
    with replica_socket(Settings(host="0.0.0.0")) as sock:  # replica_host left to its default
        assert sock.getsockname()[0] == "127.0.0.1"


def test_replica_listens_on_the_internal_address() -> None:
    public = Settings(host="0.0.0.0", replica_host="127.0.0.1")
    with replica_socket(public) as sock:
        assert sock.getsockname()[0] == "127.0.0.1"
