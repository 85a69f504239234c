"""Usage records carry cached prompt tokens and request latency (the gateway meters both).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column(
        "usage_records",
        sa.Column("cached_tokens", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "usage_records",
        sa.Column("latency_ms", sa.Integer(), server_default="0", nullable=False),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("usage_records", "latency_ms")
    op.drop_column("usage_records", "cached_tokens")
