"""Routing across the deployments of one base model: `deployments.routing_weight` (the
operator's share of routed traffic; NULL: by capacity) and `deployments.nameable` (whether
a request may name this deployment with the `X-Loraplex-Deployment` header).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("deployments", sa.Column("routing_weight", sa.Float(), nullable=True))
    op.add_column(
        "deployments",
        sa.Column("nameable", sa.Boolean(), server_default="false", nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_deployments_routing_weight"),
        "deployments",
        "routing_weight IS NULL OR (routing_weight >= 0 AND routing_weight <= 1000)",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_deployments_routing_weight"), "deployments", type_="check")
    op.drop_column("deployments", "nameable")
    op.drop_column("deployments", "routing_weight")
