"""The adapter weights are hashed once (issue 28): the direct upload records the sha256 it
computed while streaming the file to storage, the validation job keeps that value instead of
reading the whole object back to hash it again, and only a presigned upload (whose bytes never
pass through the API) is hashed by the job. The replica still hashes the bytes it fetched and
refuses a mismatch (tests/platform/engine/lora: the version's sha256 is that check's value).

Real API, real Celery worker, real S3 server; botocore's `provide-client-params` hook on the
shared session records every GetObject the API and the worker make."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from support.uploads import adapter_files, upload, wait_for_version

from loraplex.loader import object_store


class WholeGets:
    """Keys of GetObject calls without a Range (a whole object read) on clients made from now."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "GetObject" and "Range" not in params:
            self.keys.append(str(params.get("Key")))


@pytest.fixture
def whole_gets() -> Iterator[WholeGets]:
    spy = WholeGets()
    events = object_store._SESSION.events
    events.register("provide-client-params.s3.GetObject", spy, unique_id="hashed-once-spy")
    try:
        yield spy
    finally:
        events.unregister("provide-client-params.s3.GetObject", unique_id="hashed-once-spy")


def _version(client: TestClient, headers: dict, name: str) -> dict:
    resp = client.get(f"/v1/adapters/{name}/versions/1", headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_direct_upload_records_the_sha256_it_streamed(
    client: TestClient, base_model: str, make_tenant, adapter_r4: Path
) -> None:
    """No worker runs in this test: the digest is on the row before any job has read a byte."""
    _, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    want = hashlib.sha256(weights).hexdigest()
    assert upload(client, headers, "plain", base_model, config, weights).status_code == 202
    got = _version(client, headers, "plain")
    assert got["status"] == "validating" and got["sha256"] == want
    # With an idempotency key the route's fingerprint digest is the one recorded.
    extra = {"Idempotency-Key": "hashed-once-1"}
    resp = upload(client, headers, "keyed", base_model, config, weights, extra=extra)
    assert resp.status_code == 202, resp.text
    assert _version(client, headers, "keyed")["sha256"] == want


def test_validation_keeps_the_recorded_digest_without_reading_the_weights_again(
    client: TestClient, worker, deployment, base_model: str, make_tenant, adapter_r4: Path,
    whole_gets: WholeGets,
) -> None:  # fmt: skip
    _, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    assert upload(client, headers, "once", base_model, config, weights).status_code == 202
    done = wait_for_version(client, headers, "once", 1)
    assert done["status"] == "ready", done
    assert done["sha256"] == hashlib.sha256(weights).hexdigest()
    weights_reads = [k for k in whole_gets.keys if k.endswith("adapter_model.safetensors")]
    assert weights_reads == []


def test_a_presigned_upload_is_hashed_by_the_job(
    client: TestClient, worker, deployment, base_model: str, make_tenant, adapter_r4: Path,
    whole_gets: WholeGets,
) -> None:  # fmt: skip
    """Its bytes went straight to storage: the job is the first to see them, and hashes them."""
    _, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    body = {"base_model": base_model, "adapter_config": json.loads(config), "size": len(weights)}
    plan = client.post("/v1/adapters/pre/uploads", headers=headers, json=body)
    assert plan.status_code == 201, plan.text
    (part,) = plan.json()["parts"]
    put = httpx.put(part["url"], content=weights, timeout=30)
    assert put.status_code == 200
    assert _version(client, headers, "pre")["sha256"] is None
    done_resp = client.post(
        plan.json()["complete_url"],
        headers=headers,
        json={"parts": [{"part_number": 1, "etag": put.headers["ETag"]}]},
    )
    assert done_resp.status_code == 202, done_resp.text
    done = wait_for_version(client, headers, "pre", 1)
    assert done["status"] == "ready" and done["sha256"] == hashlib.sha256(weights).hexdigest()
    assert [k for k in whole_gets.keys if k.endswith("adapter_model.safetensors")] != []
