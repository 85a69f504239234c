"""`loraplex bench console`: server time of the admin console's pages on a busy database.

Seeds a real PostgreSQL (COPY) with 1,000 tenants, 20,000 adapter versions and 1,000,000
usage rows (plus keys, jobs, 100,000 refused requests, operators and audit rows; the detail
pages show the adapter with most versions and the first deployment), starts the API on it, signs in and asks each page
many times; the server time is the console's `Server-Timing` header. The same pages over an
empty database (one tenant, nothing else) are the baseline, measured in the same run:

    RESULT console.<page>_p95_ms=...            (seeded)
    RESULT console.<page>_baseline_p95_ms=...   (empty database)

    loraplex bench console [--database-url URL] [--requests 40] [--tenants 1000]
        [--versions 20000] [--usage 1000000]

Without --database-url (or LORAPLEX_DATABASE_URL) an embedded PostgreSQL is started.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from rich.console import Console
from sqlalchemy.engine import make_url

from loraplex.bench._console_seed import LOOKUP_ID, seed
from loraplex.platform.child_env import child_env
from loraplex.platform.db.migrate import upgrade
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.local_processes import start_api_process
from loraplex.platform.services.operators import create_operator
from loraplex.platform.settings import Settings

console = Console(stderr=True)
EMAIL, PASSWORD = "bench@console.bench", "bench-password-123"
CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
TIMING_RE = re.compile(r"app;dur=([0-9.]+)")


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _new_database(server_url: str, label: str) -> str:
    name = f"lp_bench_console_{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_libpq(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return url


def _drop_database(server_url: str, url: str) -> None:
    from loraplex.platform.db.session import dispose_engine

    dispose_engine(url)
    with psycopg.connect(_libpq(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


def _ids(url: str) -> dict[str, str]:
    """A tenant, an adapter (the one with most versions) and a deployment to show; on an empty
    database, one of each is made (the baseline pages then show one row)."""
    with psycopg.connect(_libpq(url)) as conn:
        if conn.execute("SELECT count(*) FROM adapters").fetchone()[0] == 0:  # type: ignore[index]
            tid, mid, aid = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
            conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 'only-tenant')", (tid,))
            conn.execute("INSERT INTO base_models (id, name, family, object_prefix, config) "
                         "VALUES (%s, 'only-model', 'dense', 'models/only/', '{}')", (mid,))  # fmt: skip
            conn.execute(
                "INSERT INTO deployments (id, name, base_model_id, weight_quantization, "
                "kv_cache_dtype, max_loras, max_lora_rank, replicas, expert_parallel_size) "
                "VALUES (%s, 'only-dep', %s, 'bf16', 'auto', 8, 64, 1, 1)", (uuid.uuid4(), mid))  # fmt: skip
            conn.execute("INSERT INTO adapters (id, tenant_id, name, base_model_id) "
                         "VALUES (%s, %s, 'only-adapter', %s)", (aid, tid, mid))  # fmt: skip
        tenant = conn.execute("SELECT id FROM tenants ORDER BY name LIMIT 1").fetchone()
        adapter = (
            conn.execute(
                "SELECT adapter_id FROM adapter_versions GROUP BY adapter_id "
                "ORDER BY count(*) DESC, adapter_id LIMIT 1"
            ).fetchone()
            or conn.execute("SELECT id FROM adapters LIMIT 1").fetchone()
        )
        dep = conn.execute("SELECT id FROM deployments ORDER BY name LIMIT 1").fetchone()
    assert tenant and adapter and dep
    return {"tenant": str(tenant[0]), "adapter": str(adapter[0]), "deployment": str(dep[0])}


def _pages(ids: dict[str, str]) -> dict[str, str]:
    tenant_id = ids["tenant"]
    return {
        "overview": "/console/",
        "usage_hour": "/console/api/usage-series?window=hour",
        "usage_day": "/console/api/usage-series?window=day",
        "tenants": "/console/tenants",
        "tenants_search": "/console/tenants?q=tenant-004",
        "tenants_page10": "/console/tenants?page=10",
        "tenant": f"/console/tenants/{tenant_id}",
        "tenant_csv": f"/console/tenants/{tenant_id}/usage.csv",
        "adapters": "/console/adapters",
        "adapters_failed": "/console/adapters?status=failed",
        "adapters_page50": "/console/adapters?page=50",
        "adapter": f"/console/adapters/{ids['adapter']}",
        "deployments": "/console/deployments",
        "deployment": f"/console/deployments/{ids['deployment']}",
        "deployment_load": f"/console/api/deployments/{ids['deployment']}/load",
        "jobs": "/console/jobs",
        "jobs_failed": "/console/jobs?status=failed",
        "audit": "/console/audit",
        "audit_filtered": "/console/audit?action=adapter",
        "jobs_sorted_attempts": "/console/jobs?sort=attempts&dir=desc",
        "audit_sorted_actor": "/console/audit?sort=actor",
        "tenants_sorted_keys": "/console/tenants?sort=keys&dir=desc",
        "tenants_sorted_page10": "/console/tenants?sort=adapters&dir=desc&page=10",
        "adapters_sorted_tenant": "/console/adapters?sort=tenant",
        "adapters_sorted_size_page50": "/console/adapters?sort=size&dir=desc&page=50",
        "request_lookup": f"/console/requests?id={LOOKUP_ID}",
        "operators": "/console/operators",
    }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def measure(settings: Settings, url: str, workdir: Path, requests: int) -> dict[str, float]:
    """p95 server time (ms) of every page, on an API process over database `url`."""
    with session_scope(make_sessionmaker(url)) as session:
        create_operator(session, EMAIL, PASSWORD, "viewer", actor="bench")
    ids = _ids(url)
    s = settings.model_copy(update={"database_url": url, "broker_url": None, "redis_url": None})
    env = child_env(s, "api")
    api_url, proc = start_api_process(env, workdir / f"api-{uuid.uuid4().hex[:6]}.log")
    out: dict[str, float] = {}
    try:
        with httpx.Client(base_url=api_url, timeout=60) as client:
            page = client.get("/console/sign-in")
            token = CSRF_RE.search(page.text).group(1)  # type: ignore[union-attr]
            r = client.post("/console/sign-in", data={"email": EMAIL, "password": PASSWORD,
                            "csrf_token": token})  # fmt: skip
            if r.status_code != 303:
                raise RuntimeError(f"sign-in failed: HTTP {r.status_code}")
            for name, path in _pages(ids).items():
                times = []
                for i in range(requests + 3):
                    resp = client.get(path)
                    if resp.status_code != 200 and not (
                        name == "request_lookup" and resp.status_code == 404
                    ):
                        raise RuntimeError(f"{path}: HTTP {resp.status_code}: {resp.text[:300]}")
                    found = TIMING_RE.search(resp.headers.get("server-timing", ""))
                    if found and i >= 3:  # 3 warm-up requests
                        times.append(float(found.group(1)))
                out[name] = _p95(times)
                console.print(f"  {name}: p95 {out[name]:.1f} ms")
    finally:
        proc.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    """Seed, measure and print RESULT lines."""
    parser = argparse.ArgumentParser(prog="loraplex bench console")
    parser.add_argument("--database-url", default=os.environ.get("LORAPLEX_DATABASE_URL"))
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--versions", type=int, default=20_000)
    parser.add_argument("--usage", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="loraplex-bench-console-"))
    pg = None
    server_url = args.database_url
    if not server_url:
        from loraplex.platform.embedded import EmbeddedPostgres

        pg = EmbeddedPostgres(work / "postgres", durable=False)
        with console.status("starting PostgreSQL"):
            server_url = pg.start()
    settings = Settings(data_dir=work / "data", admin_key="bench-admin-key")
    made: list[str] = []
    try:
        seeded, empty = _new_database(server_url, "seeded"), _new_database(server_url, "empty")
        made += [seeded, empty]
        began = time.monotonic()

        def progress(table: str, n: int) -> None:
            console.print(f"  seeded {table}: {n:,} rows ({time.monotonic() - began:.0f}s)")

        counts = seed(_libpq(seeded), tenants=args.tenants, versions=args.versions,
                      usage=args.usage, progress=progress)  # fmt: skip
        console.print(f"seeded in {time.monotonic() - began:.1f}s: {counts}")
        console.print("seeded database:")
        busy = measure(settings, seeded, work, args.requests)
        console.print("empty database (baseline):")
        base = measure(settings, empty, work, args.requests)
    finally:
        for url in made:
            _drop_database(server_url, url)
        if pg is not None:
            pg.stop()
    print(f"RESULT console.seeded_tenants={counts['tenants']}")
    print(f"RESULT console.seeded_adapter_versions={counts['adapter_versions']}")
    print(f"RESULT console.seeded_usage_rows={counts['usage_records']}")
    for name in busy:
        print(f"RESULT console.{name}_p95_ms={busy[name]:.2f}")
        print(f"RESULT console.{name}_baseline_p95_ms={base[name]:.2f}")
    print(f"RESULT console.max_page_p95_ms={max(busy.values()):.2f}")
    return 0
