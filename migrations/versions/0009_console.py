"""The admin console: operators and their sessions, tenant suspension, the operator on audit
rows, latency and failure columns on usage rows, and the indexes the console pages read by.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (index name, table, columns) of the console pages' reads.
_INDEXES = [
    ("ix_adapter_versions_created_at", "adapter_versions", ["created_at"]),
    ("ix_adapter_versions_status_created_at", "adapter_versions", ["status", "created_at"]),
    ("ix_jobs_created_at", "jobs", ["created_at"]),
    ("ix_audit_log_created_at", "audit_log", ["created_at"]),
    ("ix_audit_log_action_created_at", "audit_log", ["action", "created_at"]),
]


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "operators",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("email", sa.String(length=254), nullable=False),
        sa.Column("password_hash", sa.String(length=512), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("last_login_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "role IN ('owner', 'operator', 'viewer')", name=op.f("ck_operators_role")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operators")),
        sa.UniqueConstraint("email", name=op.f("uq_operators_email")),
    )
    op.create_table(
        "console_sessions",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("operator_id", sa.Uuid(), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["operator_id"],
            ["operators.id"],
            name=op.f("fk_console_sessions_operator_id_operators"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_console_sessions")),
    )
    op.create_index(
        op.f("ix_console_sessions_operator_id"), "console_sessions", ["operator_id"], unique=False
    )
    op.add_column("tenants", sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("audit_log", sa.Column("operator_id", sa.Uuid(), nullable=True))
    op.create_foreign_key(
        op.f("fk_audit_log_operator_id_operators"),
        "audit_log",
        "operators",
        ["operator_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_index(op.f("ix_audit_log_operator_id"), "audit_log", ["operator_id"], unique=False)
    op.add_column("usage_records", sa.Column("ttft_ms", sa.Integer(), nullable=True))
    op.add_column("usage_records", sa.Column("itl_ms", sa.Float(), nullable=True))
    op.add_column(
        "usage_records",
        sa.Column("failed", sa.Boolean(), server_default="false", nullable=False),
    )
    for name, table, columns in _INDEXES:
        op.create_index(name, table, columns, unique=False)
    # The charts' time range as an index-only scan of the columns they aggregate.
    op.create_index(
        "ix_usage_records_created_at",
        "usage_records",
        ["created_at"],
        unique=False,
        postgresql_include=["completion_tokens", "ttft_ms", "itl_ms", "failed"],
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_usage_records_created_at", table_name="usage_records")
    for name, table, _ in reversed(_INDEXES):
        op.drop_index(name, table_name=table)
    op.drop_column("usage_records", "failed")
    op.drop_column("usage_records", "itl_ms")
    op.drop_column("usage_records", "ttft_ms")
    op.drop_index(op.f("ix_audit_log_operator_id"), table_name="audit_log")
    op.drop_constraint(op.f("fk_audit_log_operator_id_operators"), "audit_log", type_="foreignkey")
    op.drop_column("audit_log", "operator_id")
    op.drop_column("tenants", "suspended_at")
    op.drop_index(op.f("ix_console_sessions_operator_id"), table_name="console_sessions")
    op.drop_table("console_sessions")
    op.drop_table("operators")
