"""Adapter versions record the sha256 of their adapter_config.json: the config (lora_alpha,
use_rslora, ...) is part of a version's cache identity, not only the weights.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("adapter_versions", sa.Column("config_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("adapter_versions", "config_sha256")
