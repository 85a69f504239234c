"""Request log: what the gateway routed a request to (the deployment, the adapter and version
asked for, the replica tried), and `in_stream` for an error event sent inside a stream that
had already answered 200, so an operator who is given its request id sees where it ran.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("deployment", "adapter_id", "adapter", "adapter_version", "replica", "in_stream")


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("request_log", sa.Column("deployment", sa.String(length=128), nullable=True))
    op.add_column("request_log", sa.Column("adapter_id", sa.Uuid(), nullable=True))
    op.add_column("request_log", sa.Column("adapter", sa.String(length=128), nullable=True))
    op.add_column("request_log", sa.Column("adapter_version", sa.Integer(), nullable=True))
    op.add_column("request_log", sa.Column("replica", sa.String(length=256), nullable=True))
    op.add_column(
        "request_log",
        sa.Column("in_stream", sa.Boolean(), server_default="false", nullable=False),
    )


def downgrade() -> None:
    """Revert this revision."""
    for name in reversed(_COLUMNS):
        op.drop_column("request_log", name)
