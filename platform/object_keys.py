"""The bucket's key layout: every object key the platform writes or reads starts here.

Two key spaces, nothing else:
- tenants' adapters: `tenants/{tenant_id}/adapters/{adapter_id}/v{n}/...` (uploads, presigned
  multipart included, land straight in the version's folder); a version's draft adapters
  (issue 25) in its `draft/{draft_id}/` subfolder, so they go with it;
- base models: `models/{name}/...`.

The IRSA policies in `infra/terraform/modules/identity` grant each workload exactly these
spaces; `tests/infra/test_iam_key_prefixes.py` derives the expected IAM globs from this module.
Torch-free and dependency-free, so the control plane, the engine and the tests can import it.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

_PART = re.compile(r"\{[a-z_]+\}")


@dataclass(frozen=True)
class KeySpace:
    """One family of object keys: a folder template whose `{parts}` vary per object owner."""

    name: str
    template: str

    def prefix(self, **parts: object) -> str:
        """The folder for one owner, e.g. `models/llama-8b/` (raises KeyError on a missing part)."""
        return self.template.format(**{k: str(v) for k, v in parts.items()})

    def iam_glob(self) -> str:
        """Every key under any owner's folder as an IAM resource pattern (`{x}` -> `*`)."""
        return _PART.sub("*", self.template) + "*"


ADAPTERS = KeySpace("adapters", "tenants/{tenant_id}/adapters/{adapter_id}/")
MODELS = KeySpace("models", "models/{name}/")
KEY_SPACES: tuple[KeySpace, ...] = (ADAPTERS, MODELS)


def adapter_prefix(tenant_id: uuid.UUID | str, adapter_id: uuid.UUID | str) -> str:
    """Folder of all of an adapter's versions."""
    return ADAPTERS.prefix(tenant_id=tenant_id, adapter_id=adapter_id)


def adapter_version_prefix(tenant_id: uuid.UUID | str, adapter_id: uuid.UUID | str, n: int) -> str:
    """Folder of one immutable adapter version (`.../v{n}/`)."""
    return f"{adapter_prefix(tenant_id, adapter_id)}v{n}/"


def version_prefix_of(key: str) -> str | None:
    """`tenants/T/adapters/A/vN/` of a key inside an adapter version's folder, else None."""
    parts = key.split("/")
    if len(parts) < 6 or not is_adapter_key(key):
        return None
    return "/".join(parts[:5]) + "/"


DRAFTS = "draft"  # a version's subfolder holding its draft adapters' folders


def draft_adapter_prefix(version_prefix: str, draft_id: uuid.UUID | str) -> str:
    """Folder of one draft adapter, inside its target version's folder (`.../v{n}/draft/{id}/`)."""
    return f"{version_prefix}{DRAFTS}/{draft_id}/"


def draft_prefix_of(key: str) -> str | None:
    """`tenants/T/adapters/A/vN/draft/D/` of a key inside a draft adapter's folder, else None."""
    parts = key.split("/")
    if len(parts) < 8 or parts[5] != DRAFTS or not parts[6] or version_prefix_of(key) is None:
        return None
    return "/".join(parts[:7]) + "/"


TENANTS_ROOT = ADAPTERS.template.split("{", 1)[0]  # "tenants/": where every adapter key starts


def model_prefix(name: str) -> str:
    """Folder of a base model's files."""
    return MODELS.prefix(name=name)


def is_adapter_key(key: str) -> bool:
    """True when `key` lies inside some adapter's folder (what the deletion job may remove)."""
    parts = key.split("/")
    return (
        len(parts) >= 5
        and parts[0] == "tenants"
        and parts[2] == "adapters"
        and all(parts[i] for i in (1, 3))
    )
