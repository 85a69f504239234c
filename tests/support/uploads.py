"""Adapter uploads: through the tenant API in-process (`upload`, a TestClient), to a running
API (`upload_adapter`, the same helper `loraplex bench serve` uses), or straight through the
adapter service (`service_uploader` + `upload_through_service`); waiting for validation."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

from loraplex.bench.serve_stack import upload_and_wait
from support.waiting import wait_until


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


def upload_adapter(stack: Any, key: str, name: str, folder: Path, timeout_s: float = 60) -> None:
    """Upload `folder` to a running stack's API and wait until the version is ready."""
    upload_and_wait(stack.api.url, key, stack.base, name, folder, timeout_s)


def service_uploader(settings: Any, tenant_id: uuid.UUID, queue: str | None = None) -> Any:
    """An adapter-service `Uploader` for `tenant_id` whose jobs go to `queue` (default: the
    settings' queue; a queue no worker reads lets a test run each job itself)."""
    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.jobs.celery_app import create_celery
    from loraplex.platform.jobs.dispatch import CeleryDispatcher
    from loraplex.platform.services import adapters as svc

    dispatcher = CeleryDispatcher(create_celery(settings), queue or settings.celery_queue)
    return svc.Uploader(
        settings=settings,
        sessions=make_sessionmaker(settings.database_url),
        dispatcher=dispatcher,
        tenant_id=tenant_id,
        actor="test",
    )


def upload_through_service(up: Any, name: str, base_model: str, adapter_dir: Path) -> Any:
    """Upload a saved adapter through the adapter service; returns the new AdapterVersion."""
    from loraplex.platform.services import adapters as svc

    config, weights = adapter_files(adapter_dir)
    return svc.upload_adapter(up, name, base_model, config, io.BytesIO(weights), len(weights))
