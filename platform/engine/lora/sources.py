"""Where an adapter version's bytes come from: a local directory or object storage.

A source knows the version's identity (`key`) before any bytes arrive, so a request can be
keyed (prefix cache, device slots) at once while the fetch runs in the background. Every
fetch checks the bytes against that identity: a re-uploaded or edited adapter is never served
under an old key. An object-storage version is named by the wire's `AdapterRef` (its one
definition, `platform.wire`; re-exported here for the engine).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loraplex.adapters.peft_format import AdapterFormatError
from loraplex.adapters.targets import ResolvedTargets
from loraplex.adapters.weights import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    adapter_version_key,
    read_adapter_dir,
)
from loraplex.platform.wire import AdapterRef

__all__ = ["AdapterRef", "DirSource", "LocalAdapterRef", "ObjectReader", "ObjectSource"]


class ObjectReader(Protocol):
    """The slice of `loraplex.loader.object_store.ObjectStore` a fetch needs."""

    def head(self, key: str) -> int: ...

    def get_range(self, key: str, start: int, end: int) -> bytes: ...


@dataclass(frozen=True)
class LocalAdapterRef:
    """A local adapter directory with the tenant it belongs to (for per-tenant fairness)."""

    path: str | Path
    tenant: str | None = None


@dataclass(frozen=True)
class DirSource:
    """A local PEFT adapter directory, identified by the sha256 of its two files."""

    path: Path
    key: str
    tenant: str | None = None

    @classmethod
    def open(cls, path: str | Path, tenant: str | None = None) -> tuple[DirSource, bytes, bytes]:
        """Read the directory once: the source (keyed by content) and both files' bytes."""
        cfg, weights = read_adapter_dir(path)
        return cls(Path(path), adapter_version_key(cfg, weights), tenant), cfg, weights

    def fetch(self) -> tuple[bytes, bytes]:
        """Re-read the files; refuses if they changed since the key was taken."""
        cfg, weights = read_adapter_dir(self.path)
        if adapter_version_key(cfg, weights) != self.key:
            raise AdapterFormatError(
                f"adapter directory {str(self.path)!r} changed since it was submitted; "
                "submit it again to serve the new version"
            )
        return cfg, weights


@dataclass(frozen=True)
class ObjectSource:
    """An adapter version in object storage (`{object_prefix}adapter_config.json`, ...)."""

    ref: AdapterRef
    store: ObjectReader
    max_bytes: int  # the engine's `adapter_max_bytes`, per file

    @property
    def key(self) -> str:
        """The version identity."""
        return self.ref.key

    @property
    def tenant(self) -> str | None:
        """The owning tenant, for fairness."""
        return self.ref.tenant

    @property
    def targets(self) -> ResolvedTargets:
        """The version's resolved targets (no pattern is ever run on the replica)."""
        return self.ref.resolved_targets()

    def _read(self, name: str) -> bytes:
        key = self.ref.object_prefix + name
        size = self.store.head(key)
        if size > self.max_bytes:
            raise AdapterFormatError(
                f"{key} is {size} bytes, over this engine's adapter_max_bytes={self.max_bytes}"
            )
        return self.store.get_range(key, 0, size) if size else b""

    def fetch(self) -> tuple[bytes, bytes]:
        """GET both objects and check the weights against the version sha256."""
        cfg = self._read(CONFIG_FILE)
        weights = self._read(WEIGHTS_FILE)
        if hashlib.sha256(weights).hexdigest() != self.ref.sha256.lower():
            raise AdapterFormatError(
                f"{self.ref.object_prefix}{WEIGHTS_FILE} does not match version sha256 "
                f"{self.ref.sha256[:12]}: refusing to serve other bytes under this version"
            )
        if (
            self.ref.config_sha256 is not None
            and hashlib.sha256(cfg).hexdigest() != self.ref.config_sha256.lower()
        ):
            raise AdapterFormatError(
                f"{self.ref.object_prefix}{CONFIG_FILE} does not match the version's config sha256"
            )
        return cfg, weights
