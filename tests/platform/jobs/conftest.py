"""Fixtures for the job tests: this module's own control plane and the tiny base model."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from support.fixtures import adapter_r4, base_model, cp_settings, tiny_llama

__all__ = ["adapter_r4", "base_model", "cp_settings", "tiny_llama"]


@pytest.fixture
def tenant_id(cp_settings: Any) -> uuid.UUID:
    """A fresh tenant."""
    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.services.tenants import create_tenant

    with session_scope(make_sessionmaker(cp_settings.database_url)) as s:
        return create_tenant(s, f"t-{uuid.uuid4().hex[:10]}").id
