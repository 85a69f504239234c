"""Hardening: resolved adapter targets, `deleting` rows, per-tenant upload bounds.

- `adapter_versions.targets`: the modules an adapter targets with rank/alpha/scale, resolved
  once at validation (replicas never run tenant regexes).
- `adapter_versions.status` may be `deleting`; `adapters.deleted_at` marks an adapter whose
  objects are being removed (its name is free again: the unique name is partial).
- `tenants.max_concurrent_uploads`, `tenants.max_stored_adapter_bytes` (NULL: Settings).

Revision ID: 0008
Revises: 0004
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATUSES = "status IN ('uploading', 'validating', 'ready', 'failed')"
_NEW_STATUSES = "status IN ('uploading', 'validating', 'ready', 'failed', 'deleting')"


def upgrade() -> None:
    """Apply this revision."""
    op.add_column(
        "adapter_versions",
        sa.Column("targets", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.drop_constraint(op.f("ck_adapter_versions_status"), "adapter_versions", type_="check")
    op.create_check_constraint(
        op.f("ck_adapter_versions_status"), "adapter_versions", _NEW_STATUSES
    )
    op.add_column("adapters", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_constraint(op.f("uq_adapters_tenant_id_name"), "adapters", type_="unique")
    op.create_index(
        "uq_adapters_tenant_id_name_live",
        "adapters",
        ["tenant_id", "name"],
        unique=True,
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.add_column("tenants", sa.Column("max_concurrent_uploads", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("max_stored_adapter_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Revert this revision (deleting rows are removed first: the old schema cannot hold them)."""
    op.drop_column("tenants", "max_stored_adapter_bytes")
    op.drop_column("tenants", "max_concurrent_uploads")
    op.execute("DELETE FROM adapters WHERE deleted_at IS NOT NULL")
    op.drop_index("uq_adapters_tenant_id_name_live", table_name="adapters")
    op.create_unique_constraint(
        op.f("uq_adapters_tenant_id_name"), "adapters", ["tenant_id", "name"]
    )
    op.drop_column("adapters", "deleted_at")
    op.execute("DELETE FROM adapter_versions WHERE status = 'deleting'")
    op.drop_constraint(op.f("ck_adapter_versions_status"), "adapter_versions", type_="check")
    op.create_check_constraint(
        op.f("ck_adapter_versions_status"), "adapter_versions", _OLD_STATUSES
    )
    op.drop_column("adapter_versions", "targets")
