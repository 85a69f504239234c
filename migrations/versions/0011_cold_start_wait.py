"""Cold-start wait: `deployments.cold_start_wait_s`, how long a request waits for a first
ready replica when all of the deployment's replicas are still starting (then 503).

Revision ID: 0011
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "deployments",
        sa.Column("cold_start_wait_s", sa.Float(), server_default="120", nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_deployments_cold_start_wait"), "deployments", "cold_start_wait_s >= 0"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_deployments_cold_start_wait"), "deployments", type_="check")
    op.drop_column("deployments", "cold_start_wait_s")
