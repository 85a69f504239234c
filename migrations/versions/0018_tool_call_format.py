"""Deployments: `tool_call_format`, how the gateway reads tool calls in the model's free output
under `tool_choice: "auto"` (one of the tokenizing package's formats); NULL: from the chat
template.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The formats as of this revision (a migration is a snapshot: it never imports the live list).
_FORMATS = ("hermes", "llama3_json", "qwen3_xml")


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("deployments", sa.Column("tool_call_format", sa.String(length=16), nullable=True))
    allowed = ", ".join(repr(f) for f in _FORMATS)
    op.create_check_constraint(
        op.f("ck_deployments_tool_call_format"),
        "deployments",
        f"tool_call_format IS NULL OR tool_call_format IN ({allowed})",
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_constraint(op.f("ck_deployments_tool_call_format"), "deployments", type_="check")
    op.drop_column("deployments", "tool_call_format")
