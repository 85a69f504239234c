"""Deployments: `speculative`, the speculative decoding its replicas run (a JSON object:
method, k_min, k_max, draft_model, as `engine_spec.speculative` reads it); NULL: off.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column(
        "deployments",
        sa.Column("speculative", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("deployments", "speculative")
