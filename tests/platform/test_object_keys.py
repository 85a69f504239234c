"""The bucket key layout: one module builds every key, and the services use it."""

from __future__ import annotations

import uuid

from loraplex.platform import object_keys
from loraplex.platform.services import adapters, base_models


def test_prefixes_and_globs() -> None:
    t, a = uuid.uuid4(), uuid.uuid4()
    assert object_keys.adapter_prefix(t, a) == f"tenants/{t}/adapters/{a}/"
    assert object_keys.adapter_version_prefix(t, a, 2) == f"tenants/{t}/adapters/{a}/v2/"
    assert object_keys.model_prefix("m") == "models/m/"
    assert object_keys.ADAPTERS.iam_glob() == "tenants/*/adapters/*/*"
    assert object_keys.MODELS.iam_glob() == "models/*/*"


def test_services_build_keys_with_the_layout_module() -> None:
    assert adapters.adapter_prefix is object_keys.adapter_prefix
    assert adapters.adapter_version_prefix is object_keys.adapter_version_prefix
    assert base_models.model_prefix is object_keys.model_prefix


def test_deletion_scope() -> None:
    t, a = uuid.uuid4(), uuid.uuid4()
    assert object_keys.is_adapter_key(object_keys.adapter_prefix(t, a))
    for bad in ("tenants/", f"tenants/{t}/", "models/m/", f"tenants/{t}/adapters//", ""):
        assert not object_keys.is_adapter_key(bad), bad
