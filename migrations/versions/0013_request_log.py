"""Request log: tenant requests the API refused or failed (status >= 400), for the console's
charts (refusals count as requests and errors) and its request lookup by id; operators get a
one-time set-password link (invitation or reset), stored as its sha256 with an expiry.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("operators", sa.Column("invite_token_hash", sa.String(length=64), nullable=True))
    op.add_column(
        "operators", sa.Column("invite_expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_unique_constraint(
        op.f("uq_operators_invite_token_hash"), "operators", ["invite_token_hash"]
    )
    op.create_table(
        "request_log",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),
        sa.Column("api_key_id", sa.Uuid(), nullable=True),
        sa.Column("method", sa.String(length=8), nullable=False),
        sa.Column("path", sa.String(length=256), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("code", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_request_log_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_log")),
    )
    op.create_index(op.f("ix_request_log_request_id"), "request_log", ["request_id"])
    op.create_index(op.f("ix_request_log_tenant_id"), "request_log", ["tenant_id"])
    op.create_index(
        op.f("ix_request_log_created_at"),
        "request_log",
        ["created_at"],
        postgresql_include=["status", "path"],
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_request_log_created_at"), table_name="request_log")
    op.drop_index(op.f("ix_request_log_tenant_id"), table_name="request_log")
    op.drop_index(op.f("ix_request_log_request_id"), table_name="request_log")
    op.drop_table("request_log")
    op.drop_constraint(op.f("uq_operators_invite_token_hash"), "operators", type_="unique")
    op.drop_column("operators", "invite_expires_at")
    op.drop_column("operators", "invite_token_hash")
