"""Shared helpers for the control-plane tests (tests/api, tests/platform/db, tests/platform/jobs):
a fresh migrated database, bucket and Celery queue per test module, tiny HF models and PEFT
adapters, and hand-made (broken) safetensors files. Real services only: the session fixtures
of tests/conftest.py provide PostgreSQL, S3 and Redis.
"""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

DEFAULT_LLAMA = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(pg_url: str, label: str) -> str:
    """Create an empty database next to `pg_url`'s; return its SQLAlchemy URL."""
    name = f"lp_{''.join(c for c in label.lower() if c.isalnum())[:30]}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_libpq(pg_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(pg_url).set(database=name).render_as_string(hide_password=False)


def drop_database(pg_url: str, url: str) -> None:
    """Drop a database made by `create_database` (closing our pooled connections first)."""
    from loraplex.platform.db.session import dispose_engine

    dispose_engine(url)
    name = make_url(url).database
    with psycopg.connect(_libpq(pg_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def empty_bucket(s3_client: Any, bucket: str) -> None:
    """Delete every object (and unfinished upload) in a bucket, then the bucket."""
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3_client.delete_object(Bucket=bucket, Key=obj["Key"])
    for up in s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) or []:
        s3_client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    s3_client.delete_bucket(Bucket=bucket)


@contextmanager
def control_plane(
    pg_url: str, settings: Any, s3_client: Any, label: str, **overrides: Any
) -> Iterator[Any]:
    """Settings over a fresh migrated database, a fresh bucket and a private Celery queue."""
    from loraplex.platform.db.migrate import upgrade

    url = create_database(pg_url, label)
    bucket = f"lp-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    try:
        upgrade(url)
        yield settings.model_copy(
            update={
                "database_url": url,
                "s3_bucket": bucket,
                "celery_queue": f"lp-test-{uuid.uuid4().hex[:8]}",
                **overrides,
            }
        )
    finally:
        drop_database(pg_url, url)
        empty_bucket(s3_client, bucket)


@contextmanager
def running_worker(settings: Any) -> Iterator[Any]:
    """A real Celery worker (solo pool, in a thread) consuming `settings`' queue."""
    from celery.contrib.testing.worker import start_worker

    from loraplex.platform.jobs.celery_app import create_celery

    app = create_celery(settings)
    with start_worker(
        app, pool="solo", perform_ping_check=False, shutdown_timeout=30, loglevel="WARNING"
    ) as worker:
        yield worker


def tiny_llama_dir(path: Path, **overrides: Any) -> Path:
    """A random-weight Llama saved in the HuggingFace layout (config.json + safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**DEFAULT_LLAMA, **overrides})
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def peft_adapter_dir(
    model_dir: Path,
    out: Path,
    *,
    r: int = 4,
    alpha: float = 8,
    targets: Any = ("q_proj", "v_proj"),
    **lora: Any,
) -> Path:
    """A PEFT LoRA adapter over the model at `model_dir`, saved with save_pretrained."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    target = list(targets) if not isinstance(targets, str) else targets
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=target,
        lora_dropout=0.0,
        init_lora_weights=False,
        **lora,
    )
    get_peft_model(model, cfg).save_pretrained(out)
    return out


def safetensors_from_header(
    header: dict[str, Any], data_len: int, length: int | None = None, pad: int = 0
) -> bytes:
    """Raw safetensors bytes from a header dict and `data_len` zero bytes of data; `length`
    overrides the 8-byte header length (to build broken files)."""
    raw = json.dumps(header).encode() + b" " * pad
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + bytes(data_len)


def read_header(data: bytes) -> dict[str, Any]:
    """The JSON header of safetensors bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> Any:
    """Poll until `predicate()` is truthy; return its value (AssertionError on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# Fixtures shared by the control-plane test folders (imported into their conftest.py files).
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama in the HuggingFace layout (2 layers, hidden 64)."""
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def adapter_r4(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid PEFT adapter (rank 4 on q_proj, v_proj) for `tiny_llama`."""
    return peft_adapter_dir(tiny_llama, tmp_path_factory.mktemp("adapter-r4"), r=4, alpha=8)


@pytest.fixture(scope="session")
def adapter_r16(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid PEFT adapter of rank 16 on every linear, rsLoRA (over an 8-rank limit)."""
    return peft_adapter_dir(
        tiny_llama,
        tmp_path_factory.mktemp("adapter-r16"),
        r=16,
        alpha=16,
        targets="all-linear",
        use_rslora=True,
    )


def adapter_files(adapter_dir: Path) -> tuple[bytes, bytes]:
    """(adapter_config.json bytes, adapter_model.safetensors bytes) of a saved adapter."""
    return (
        (adapter_dir / "adapter_config.json").read_bytes(),
        (adapter_dir / "adapter_model.safetensors").read_bytes(),
    )


def upload(
    client: Any,
    headers: dict[str, str],
    name: str,
    base_model: str,
    config: bytes | None,
    weights: bytes | None,
    *,
    extra: dict[str, str] | None = None,
    weights_filename: str = "adapter_model.safetensors",
) -> Any:
    """POST /v1/adapters as multipart (a None file is left out)."""
    files: dict[str, Any] = {}
    if config is not None:
        files["adapter_config"] = ("adapter_config.json", config, "application/json")
    if weights is not None:
        files["adapter_model"] = (weights_filename, weights, "application/octet-stream")
    return client.post(
        "/v1/adapters",
        headers={**headers, **(extra or {})},
        data={"name": name, "base_model": base_model},
        files=files,
    )


def wait_for_version(
    client: Any, headers: dict[str, str], name: str, n: int, timeout: float = 60.0
) -> dict[str, Any]:
    """Poll GET /v1/adapters/{name}/versions/{n} until it is ready or failed."""

    def done() -> dict[str, Any] | None:
        r = client.get(f"/v1/adapters/{name}/versions/{n}", headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        return body if body["status"] in ("ready", "failed") else None

    return wait_until(done, timeout=timeout, interval=0.2, what=f"{name} v{n} to finish")


def tenant_keys(s3_client: Any, bucket: str, tenant_id: str) -> list[str]:
    """Every object key stored for a tenant."""
    keys = []
    for page in s3_client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"tenants/{tenant_id}/"
    ):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys
