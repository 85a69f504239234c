"""Per-tenant rate limits and monthly token quota (NULL: the deployment default).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("tenants", sa.Column("requests_per_minute", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True))
    op.add_column("tenants", sa.Column("monthly_token_quota", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("tenants", "monthly_token_quota")
    op.drop_column("tenants", "tokens_per_minute")
    op.drop_column("tenants", "requests_per_minute")
