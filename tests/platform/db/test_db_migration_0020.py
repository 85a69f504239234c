"""Migration 0020 (issue 25): the `draft_adapters` table comes with the upgrade, goes with the
downgrade, and a draft adapter row goes with its target adapter version (ON DELETE CASCADE)."""

from __future__ import annotations

import uuid

from sqlalchemy import inspect, text

from loraplex.platform.db import migrate
from loraplex.platform.db.session import get_engine


def test_0020_adds_and_drops_draft_adapters_and_cascades(empty_db_url: str) -> None:
    def tables() -> set[str]:
        return set(inspect(get_engine(empty_db_url)).get_table_names())

    migrate.upgrade(empty_db_url, "0020")
    assert "draft_adapters" in tables()
    t, b, a, v = (uuid.uuid4() for _ in range(4))
    with get_engine(empty_db_url).begin() as conn:
        conn.execute(text("INSERT INTO tenants (id, name) VALUES (:t, 'x')"), {"t": t})
        conn.execute(
            text(
                "INSERT INTO base_models (id, name, family, object_prefix, config) "
                "VALUES (:b, 'm', 'dense', 'models/m/', '{}')"
            ),  # fmt: skip
            {"b": b},
        )
        conn.execute(
            text(
                "INSERT INTO adapters (id, tenant_id, name, base_model_id) VALUES (:a, :t, 'n', :b)"
            ),  # fmt: skip
            {"a": a, "t": t, "b": b},
        )
        conn.execute(
            text(
                "INSERT INTO adapter_versions (id, tenant_id, adapter_id, n, object_prefix, "
                "status) VALUES (:v, :t, :a, 1, 'p/', 'ready')"
            ),  # fmt: skip
            {"v": v, "t": t, "a": a},
        )
        conn.execute(
            text("INSERT INTO draft_adapters (id, tenant_id, adapter_version_id, draft_model, "
                 "object_prefix, status) VALUES (:d, :t, :v, 'dm', 'p/draft/', 'validating')"),
            {"d": uuid.uuid4(), "t": t, "v": v},
        )  # fmt: skip
        conn.execute(text("DELETE FROM adapter_versions WHERE id = :v"), {"v": v})
        left = conn.execute(text("SELECT count(*) FROM draft_adapters")).scalar_one()
    assert left == 0
    migrate.downgrade(empty_db_url, "0019")
    assert "draft_adapters" not in tables()
    migrate.upgrade(empty_db_url)
    assert "draft_adapters" in tables()
