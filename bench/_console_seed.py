"""Seed a console benchmark database fast with COPY: tenants, keys, adapters and their
versions, jobs, usage rows (spread over 30 days, each for an adapter version), refused requests,
operators and audit rows, like a busy platform."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg

CHUNK = 50_000
STATUSES = ["ready"] * 17 + ["failed"] * 2 + ["validating"]
TARGETS = json.dumps(["q_proj", "k_proj", "v_proj", "o_proj"])


def _ts(t: datetime) -> str:
    return t.isoformat()


def _copy(
    conn: psycopg.Connection, table: str, columns: str, rows: Iterable[tuple], progress: Callable
) -> int:
    """COPY `rows` (tuples of str | None) into `table` in text format; returns the count."""
    n = 0
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as cp:
        buf: list[str] = []
        for row in rows:
            buf.append("\t".join("\\N" if v is None else str(v) for v in row))
            n += 1
            if len(buf) >= CHUNK:
                cp.write("\n".join(buf) + "\n")
                buf.clear()
                progress(table, n)
        if buf:
            cp.write("\n".join(buf) + "\n")
    progress(table, n)
    return n


def seed(
    url: str,
    *,
    tenants: int,
    versions: int,
    usage: int,
    progress: Callable[[str, int], None],
    seed_value: int = 0,
) -> dict[str, int]:
    """Fill the (migrated, empty) database at libpq `url`; returns rows per table."""
    rng = random.Random(seed_value)
    now = datetime.now(UTC)
    t_ids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(tenants)]
    models = [(uuid.uuid4(), f"model-{i}") for i in range(2)]
    adapters = max(1, versions // 2)
    counts: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        counts["base_models"] = _copy(conn, "base_models", "id, name, family, object_prefix, config",
            ((m, name, "dense", f"models/{name}/", '{"architectures": ["LlamaForCausalLM"]}')
             for m, name in models), progress)  # fmt: skip
        counts["deployments"] = _copy(
            conn, "deployments",
            "id, name, base_model_id, weight_quantization, kv_cache_dtype, max_loras, "
            "max_lora_rank, replicas, expert_parallel_size",
            ((uuid.uuid4(), f"dep-{i}", m, "bf16", "auto", 8, 64, 2, 1)
             for i, (m, _) in enumerate(models)), progress)  # fmt: skip
        counts["tenants"] = _copy(conn, "tenants", "id, name, created_at",
            ((t, f"tenant-{i:05d}", _ts(now - timedelta(days=90, minutes=i)))
             for i, t in enumerate(t_ids)), progress)  # fmt: skip
        counts["api_keys"] = _copy(conn, "api_keys", "id, tenant_id, name, prefix, key_hash, scopes",
            ((uuid.uuid4(), t, f"key-{k}", "lp_bench", uuid.uuid4().hex + uuid.uuid4().hex,
              '["adapters", "inference"]') for t in t_ids for k in range(2)), progress)  # fmt: skip
        a_rows = [(uuid.uuid4(), t_ids[i % tenants], models[i % 2][0], i) for i in range(adapters)]
        counts["adapters"] = _copy(conn, "adapters", "id, tenant_id, name, base_model_id, created_at",
            ((a, t, f"adapter-{i}", m, _ts(now - timedelta(days=60, seconds=i)))
             for a, t, m, i in a_rows), progress)  # fmt: skip
        v_rows = []
        for j in range(versions):
            a, t, _, i = a_rows[j % adapters]
            v_rows.append((uuid.uuid4(), t, a, j // adapters + 1, rng.choice(STATUSES),
                           now - timedelta(days=rng.random() * 60)))  # fmt: skip
        counts["adapter_versions"] = _copy(
            conn, "adapter_versions",
            "id, tenant_id, adapter_id, n, object_prefix, status, error, sha256, bytes, rank, "
            "target_modules, created_at, updated_at",
            ((v, t, a, n, f"tenants/{t}/adapters/{a}/v{n}/", st,
              "rank 128 is over the deployment's max_lora_rank 64" if st == "failed" else None,
              uuid.uuid4().hex * 2, 4_194_304, 16, TARGETS, _ts(c), _ts(c))
             for v, t, a, n, st, c in v_rows), progress)  # fmt: skip
        counts["jobs"] = _copy(
            conn, "jobs", "id, tenant_id, kind, subject_id, status, attempts, error, created_at",
            ((uuid.uuid4(), t, "validate_adapter_version", v,
              {"ready": "succeeded", "failed": "failed"}.get(st, "running"), 1,
              "rank over the limit" if st == "failed" else None, _ts(c))
             for v, t, a, n, st, c in v_rows), progress)  # fmt: skip
        counts["usage_records"] = _copy(
            conn,
            "usage_records",
            "tenant_id, adapter_version_id, model, prompt_tokens, completion_tokens, latency_ms, "
            "ttft_ms, itl_ms, failed, created_at",
            _usage_rows(rng, [(v, t) for v, t, *_ in v_rows], usage, now),
            progress,
        )
        counts["request_log"] = _copy(
            conn, "request_log",
            "request_id, created_at, tenant_id, method, path, status, code, message, latency_ms",
            _refusals(rng, t_ids, usage // 10, now), progress)  # fmt: skip
        counts["operators"] = _copy(conn, "operators", "id, email, password_hash, role",
            ((uuid.uuid4(), f"op-{i:03d}@bench.example", "!", ("owner", "operator", "viewer")[i % 3])
             for i in range(60)), progress)  # fmt: skip
        counts["audit_log"] = _copy(
            conn, "audit_log", "tenant_id, actor, action, resource_type, resource_id, detail, created_at",
            ((t, f"api_key:{uuid.uuid4()}", "adapter.upload", "adapter_version", v, '{"n": 1}', _ts(c))
             for v, t, a, n, st, c in v_rows), progress)  # fmt: skip
    # What autovacuum does on a live database: statistics and the visibility map.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return counts


def _usage_rows(
    rng: random.Random, versions: list[tuple[uuid.UUID, uuid.UUID]], count: int, now: datetime
) -> Iterator[tuple]:
    # Oldest first, as a live platform writes them (the table is in time order on disk); each
    # row is a request to one adapter version of its tenant.
    span = 30 * 86400.0
    offsets = sorted((rng.random() * span for _ in range(count)), reverse=True)
    for offset in offsets:
        out = rng.randint(1, 512)
        ttft = rng.randint(20, 900)
        v, t = versions[rng.randrange(len(versions))]
        yield (t, v, "model-0", rng.randint(5, 2000), out, ttft + out * 12, ttft,
               round(rng.uniform(5, 40), 2), "t" if rng.random() < 0.01 else "f",
               _ts(now - timedelta(seconds=offset)))  # fmt: skip


LOOKUP_ID = "req_bench_lookup"
_REFUSALS = [(401, "invalid_api_key"), (404, "model_not_found"), (429, "rate_limit_exceeded")]


def _refusals(
    rng: random.Random, t_ids: list[uuid.UUID], count: int, now: datetime
) -> Iterator[tuple]:
    """Refused inference requests over 30 days, oldest first; the newest has LOOKUP_ID."""
    span = 30 * 86400.0
    offsets = sorted((rng.random() * span for _ in range(count)), reverse=True)
    for i, offset in enumerate(offsets):
        status, code = rng.choice(_REFUSALS)
        rid = LOOKUP_ID if i == count - 1 else f"req_{uuid.UUID(int=rng.getrandbits(128)).hex}"
        yield (rid, _ts(now - timedelta(seconds=offset)), rng.choice(t_ids), "POST",
               "/v1/chat/completions", status, code, "refused", rng.randint(1, 30))  # fmt: skip
