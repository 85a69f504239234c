"""Draft adapters (issue 25): `draft_adapters`, a LoRA for a deployment's draft model tied to
one adapter version (one per version and draft model), validated like a version.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The statuses as of this revision (a migration is a snapshot: it never imports the live list).
_STATUSES = ("uploading", "validating", "ready", "failed", "deleting")


def upgrade() -> None:
    """Apply this revision."""
    allowed = ", ".join(repr(s) for s in _STATUSES)
    op.create_table(
        "draft_adapters",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("adapter_version_id", sa.Uuid(), nullable=False),
        sa.Column("draft_model", sa.String(length=1024), nullable=False),
        sa.Column("object_prefix", sa.String(length=512), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("config_sha256", sa.String(length=64), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("alpha", sa.Float(), nullable=True),
        sa.Column("targets", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(f"status IN ({allowed})", name=op.f("ck_draft_adapters_status")),
        sa.ForeignKeyConstraint(
            ["adapter_version_id"],
            ["adapter_versions.id"],
            name=op.f("fk_draft_adapters_adapter_version_id_adapter_versions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_draft_adapters_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_draft_adapters")),
        sa.UniqueConstraint(
            "adapter_version_id",
            "draft_model",
            name=op.f("uq_draft_adapters_adapter_version_id_draft_model"),
        ),
    )
    op.create_index(
        op.f("ix_draft_adapters_adapter_version_id"), "draft_adapters", ["adapter_version_id"]
    )
    op.create_index(op.f("ix_draft_adapters_tenant_id"), "draft_adapters", ["tenant_id"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_draft_adapters_tenant_id"), table_name="draft_adapters")
    op.drop_index(op.f("ix_draft_adapters_adapter_version_id"), table_name="draft_adapters")
    op.drop_table("draft_adapters")
