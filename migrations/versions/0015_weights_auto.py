"""Deployment weight choice `auto` (the device's native compute type, or a pre-quantized
checkpoint's own scheme; the default for new deployments) joins the check constraint.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "int4_sym", "awq", "gptq")
_NEW = ("auto", *_OLD)


def _check(values: tuple[str, ...]) -> str:
    return "weight_quantization IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_deployments_weight_q"), "deployments", type_="check")
    op.create_check_constraint(op.f("ck_deployments_weight_q"), "deployments", _check(_NEW))


def downgrade() -> None:
    # Rows on `auto` cannot be kept under the old constraint: refuse rather than guess a type.
    bind = op.get_bind()
    auto = bind.exec_driver_sql(
        "SELECT count(*) FROM deployments WHERE weight_quantization = 'auto'"
    ).scalar()
    if auto:
        raise RuntimeError(
            f"{auto} deployment(s) use weights auto; give them an explicit choice (fp32, bf16, "
            "...) before downgrading below 0015"
        )
    op.drop_constraint(op.f("ck_deployments_weight_q"), "deployments", type_="check")
    op.create_check_constraint(op.f("ck_deployments_weight_q"), "deployments", _check(_OLD))
