"""Deployment weight choices: `int4_sym` (symmetric int4 g128) and the pre-quantized checkpoint
schemes `awq` and `gptq` join the check constraint.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
_NEW = (*_OLD, "int4_sym", "awq", "gptq")


def _check(values: tuple[str, ...]) -> str:
    return "weight_quantization IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_deployments_weight_q"), "deployments", type_="check")
    op.create_check_constraint(op.f("ck_deployments_weight_q"), "deployments", _check(_NEW))


def downgrade() -> None:
    # Rows with a newer choice cannot be kept under the old constraint: refuse rather than lose.
    bind = op.get_bind()
    newer = bind.exec_driver_sql(
        "SELECT count(*) FROM deployments WHERE weight_quantization IN ('int4_sym', 'awq', 'gptq')"
    ).scalar()
    if newer:
        raise RuntimeError(
            f"{newer} deployment(s) use int4_sym, awq or gptq; change or delete them before "
            "downgrading below 0012"
        )
    op.drop_constraint(op.f("ck_deployments_weight_q"), "deployments", type_="check")
    op.create_check_constraint(op.f("ck_deployments_weight_q"), "deployments", _check(_OLD))
