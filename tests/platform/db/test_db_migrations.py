"""The first Alembic revision on real PostgreSQL: upgrade, downgrade, and agreement with the
SQLAlchemy models (autogenerate finds nothing to change)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from loraplex.platform.db import migrate
from loraplex.platform.db.models import (
    Adapter,
    AdapterVersion,
    Base,
    BaseModel,
    Deployment,
    Tenant,
)
from loraplex.platform.db.session import get_engine, make_sessionmaker

ROOT = Path(__file__).resolve().parents[3]
TABLES = {
    "tenants",
    "api_keys",
    "base_models",
    "deployments",
    "adapters",
    "adapter_versions",
    "jobs",
    "usage_records",
    "audit_log",
    "idempotency_keys",
    "request_log",
}


def _head() -> str:
    """The one head of the migration chain (two heads would mean two unordered migrations)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(migrate.alembic_config("postgresql://unused")).get_heads()
    assert len(heads) == 1, f"the migration chain has {len(heads)} heads: {heads}"
    return heads[0]


def test_the_chain_is_one_line_of_numbered_files() -> None:
    numbers = sorted(p.name[:4] for p in (ROOT / "migrations" / "versions").glob("0*.py"))
    assert _head() == numbers[-1]


def _tables(url: str) -> set[str]:
    return set(inspect(get_engine(url)).get_table_names())


def test_upgrade_builds_every_table_and_downgrade_removes_them(empty_db_url: str) -> None:
    assert migrate.current_revision(empty_db_url) is None
    migrate.upgrade(empty_db_url)
    assert migrate.current_revision(empty_db_url) == _head()
    assert _tables(empty_db_url) >= TABLES
    migrate.downgrade(empty_db_url, "base")
    assert migrate.current_revision(empty_db_url) is None
    assert _tables(empty_db_url) & TABLES == set()
    migrate.upgrade(empty_db_url)  # and back up again, cleanly
    assert _tables(empty_db_url) >= TABLES


def test_models_and_migrations_agree(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    with get_engine(empty_db_url).connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_model_diff_is_detected_when_schema_drifts(empty_db_url: str) -> None:
    """The comparison can fail: drop a column and it must report it."""
    migrate.upgrade(empty_db_url)
    with get_engine(empty_db_url).begin() as conn:
        conn.execute(text("ALTER TABLE adapter_versions DROP COLUMN sha256"))
    with get_engine(empty_db_url).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert any(d[0] == "add_column" and d[3].name == "sha256" for d in diff)


def test_alembic_command_line_upgrades_with_env_url(empty_db_url: str) -> None:
    env = {**os.environ, "LORAPLEX_DATABASE_URL": empty_db_url}
    cmd = [
        sys.executable,
        "-m",
        "alembic",
        "-c",
        str(ROOT / "migrations" / "alembic.ini"),
        "upgrade",
        "head",
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert migrate.current_revision(empty_db_url) == _head()


def test_constraints_hold(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    sessions = make_sessionmaker(empty_db_url)
    with sessions() as s, s.begin():
        tenant = Tenant(id=uuid.uuid4(), name="t1")
        base = BaseModel(
            id=uuid.uuid4(),
            name="m",
            family="dense",
            object_prefix="models/m/",
            config={"hidden_size": 8},
        )
        s.add_all([tenant, base])
        s.flush()
        adapter = Adapter(id=uuid.uuid4(), tenant_id=tenant.id, name="a", base_model_id=base.id)
        s.add(adapter)
        s.flush()
        s.add(
            AdapterVersion(
                id=uuid.uuid4(),
                tenant_id=tenant.id,
                adapter_id=adapter.id,
                n=1,
                object_prefix="p/",
                status="uploading",
            )
        )
    ids = (tenant.id, adapter.id)

    def add_version(n: int, status: str) -> None:
        with sessions() as s, s.begin():
            s.add(
                AdapterVersion(
                    id=uuid.uuid4(),
                    tenant_id=ids[0],
                    adapter_id=ids[1],
                    n=n,
                    object_prefix="p/",
                    status=status,
                )
            )

    with pytest.raises(IntegrityError):
        add_version(1, "uploading")  # (adapter_id, n) is unique
    with pytest.raises(IntegrityError):
        add_version(2, "bogus")  # status is one of the four states
    add_version(2, "validating")
    with pytest.raises(IntegrityError), sessions() as s, s.begin():
        s.add(Adapter(id=uuid.uuid4(), tenant_id=ids[0], name="a", base_model_id=base.id))


def test_0003_adds_and_drops_config_sha256(empty_db_url: str) -> None:
    def columns() -> set[str]:
        return {
            c["name"] for c in inspect(get_engine(empty_db_url)).get_columns("adapter_versions")
        }

    migrate.upgrade(empty_db_url)
    assert "config_sha256" in columns()
    migrate.downgrade(empty_db_url, "0002")
    assert migrate.current_revision(empty_db_url) == "0002"
    assert "config_sha256" not in columns()
    migrate.upgrade(empty_db_url)
    assert "config_sha256" in columns()


def test_0004_adds_and_drops_tenant_limits(empty_db_url: str) -> None:
    limits = {"requests_per_minute", "tokens_per_minute", "monthly_token_quota"}

    def columns() -> set[str]:
        return {c["name"] for c in inspect(get_engine(empty_db_url)).get_columns("tenants")}

    migrate.upgrade(empty_db_url)
    assert columns() >= limits
    migrate.downgrade(empty_db_url, "0003")
    assert migrate.current_revision(empty_db_url) == "0003"
    assert columns() & limits == set()
    migrate.upgrade(empty_db_url)
    assert columns() >= limits


def test_0012_admits_int4_sym_awq_gptq_and_downgrade_refuses_to_lose_them(
    empty_db_url: str,
) -> None:
    migrate.upgrade(empty_db_url, "0012")
    sessions = make_sessionmaker(empty_db_url)

    def deploy(name: str, weights: str) -> uuid.UUID:
        with sessions() as s, s.begin():
            base = BaseModel(
                id=uuid.uuid4(), name=name, family="dense", object_prefix=f"m/{name}/", config={}
            )
            s.add(base)
            s.flush()
            # the columns 0012 has (a Core insert: later revisions' columns are not named)
            dep_id = uuid.uuid4()
            s.execute(
                Deployment.__table__.insert().values(
                    id=dep_id,
                    name=name,
                    base_model_id=base.id,
                    weight_quantization=weights,
                    kv_cache_dtype="auto",
                    max_loras=8,
                    max_lora_rank=16,
                    replicas=1,
                    expert_parallel_size=1,
                )
            )
        return dep_id

    for choice in ("int4_sym", "awq", "gptq"):
        deploy(choice, choice)
    with pytest.raises(IntegrityError):
        deploy("bogus", "int3")
    with pytest.raises(RuntimeError, match="3 deployment"):
        migrate.downgrade(empty_db_url, "0011")
    assert migrate.current_revision(empty_db_url) == "0012"  # refused whole, nothing changed
    with get_engine(empty_db_url).begin() as conn:
        conn.execute(text("DELETE FROM deployments"))
    migrate.downgrade(empty_db_url, "0011")
    with pytest.raises(IntegrityError):
        deploy("sym", "int4_sym")  # the old constraint is back
    migrate.upgrade(empty_db_url)


def test_0019_adds_and_drops_deployment_speculative(empty_db_url: str) -> None:
    def columns() -> set[str]:
        return {c["name"] for c in inspect(get_engine(empty_db_url)).get_columns("deployments")}

    migrate.upgrade(empty_db_url, "0019")
    assert "speculative" in columns()
    migrate.downgrade(empty_db_url, "0018")
    assert "speculative" not in columns()
    migrate.upgrade(empty_db_url)
    assert "speculative" in columns()
