"""Fixtures for the job tests: this module's own control plane and the tiny base model."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cp_support import adapter_r4, control_plane, tiny_llama

__all__ = ["adapter_r4", "tiny_llama"]


@pytest.fixture(scope="module")
def cp_settings(
    pg_url: str, settings: Any, s3_client: Any, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """Settings over this module's own database, bucket and queue."""
    with control_plane(pg_url, settings, s3_client, request.module.__name__) as s:
        yield s


@pytest.fixture(scope="module")
def base_model(cp_settings: Any, tiny_llama: Path) -> str:
    """The tiny Llama registered as a base model."""
    from loraplex.platform.services.base_models import register_base_model

    register_base_model(cp_settings, "tiny-llama", tiny_llama)
    return "tiny-llama"


@pytest.fixture
def tenant_id(cp_settings: Any) -> uuid.UUID:
    """A fresh tenant."""
    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.services.tenants import create_tenant

    with session_scope(make_sessionmaker(cp_settings.database_url)) as s:
        return create_tenant(s, f"t-{uuid.uuid4().hex[:10]}").id
