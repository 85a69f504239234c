"""Bad uploads: each gets a clear 4xx, or a `failed` version with the reason from the real
validation job, and leaves no orphan object and no half-written row."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from support.control_plane import tenant_keys
from support.safetensors_bytes import read_header, safetensors_from_header
from support.uploads import adapter_files, upload, wait_for_version

SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}
A_Q0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B_Q0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def build(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """Valid-framed safetensors with these (dtype, shape) entries, contiguous offsets."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = SIZES[dtype] * (shape[0] * shape[1])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return safetensors_from_header(header, offset)


def entries(weights: bytes) -> dict[str, tuple[str, list[int]]]:
    return {
        k: (v["dtype"], v["shape"]) for k, v in read_header(weights).items() if k != "__metadata__"
    }


def _overlapping(weights: bytes) -> bytes:
    header = {k: v for k, v in read_header(weights).items() if k != "__metadata__"}
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    second = header[names[1]]
    span = second["data_offsets"][1] - second["data_offsets"][0]
    second["data_offsets"] = [second["data_offsets"][0] - 8, second["data_offsets"][0] - 8 + span]
    end = max(v["data_offsets"][1] for v in header.values())
    return safetensors_from_header(header, end)


def _retype(weights: bytes, dtype: str) -> bytes:
    return build({k: (dtype, shape) for k, (_, shape) in entries(weights).items()})


def _reshape_first(weights: bytes) -> bytes:
    e = entries(weights)
    dtype, shape = e[A_Q0]
    e[A_Q0] = (dtype, [shape[0], shape[1] - 1])
    return build(e)


def _rename(weights: bytes, old: str, new: str) -> bytes:
    return build({new if k == old else k: v for k, v in entries(weights).items()})


def _drop(weights: bytes, name: str) -> bytes:
    return build({k: v for k, v in entries(weights).items() if k != name})


def _with_length(weights: bytes, n: int) -> bytes:
    return n.to_bytes(8, "little") + weights[8:]


def _pickle_bytes() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    return buf.getvalue()


# (case id, how to make (config, weights) from the valid pair, expected message fragment)
JOB_FAILURES = [
    ("truncated", lambda c, w: (c, w[:-16]), "file length mismatch"),
    ("header_length_past_end", lambda c, w: (c, _with_length(w, len(w))), "past the end"),
    ("oversized_header", lambda c, w: (c, _with_length(w, 1 << 40)), "header too large"),
    ("overlapping_offsets", lambda c, w: (c, _overlapping(w)), "overlap"),
    ("wrong_dtype", lambda c, w: (c, _retype(w, "I64")), "dtype I64"),
    ("shape_mismatch", lambda c, w: (c, _reshape_first(w)), "shape"),
    (
        "unknown_target_module",
        lambda c, w: (c, _rename(w, A_Q0, A_Q0.replace("q_proj", "foo_proj"))),
        "unexpected tensor name",
    ),
    (
        "layer_beyond_base_model",
        lambda c, w: (
            c,
            _rename(
                _rename(w, A_Q0, A_Q0.replace("layers.0", "layers.7")),
                B_Q0,
                B_Q0.replace("layers.0", "layers.7"),
            ),
        ),
        "does not have",
    ),
    (
        "module_not_in_target_modules",
        lambda c, w: (json.dumps({**json.loads(c), "target_modules": ["v_proj"]}).encode(), w),
        "does not include",
    ),
    ("missing_lora_b", lambda c, w: (c, _drop(w, B_Q0)), "no lora_B"),
    (
        "header_not_json",
        lambda c, w: (c, safetensors_from_header({}, 0)[:8].replace(b"\x02", b"\x04") + b"{x: 1"),
        "invalid header",
    ),
    ("no_tensors", lambda c, w: (c, safetensors_from_header({}, 0)), "no tensors"),
]

SYNC_REFUSALS = [
    ("missing_config", lambda c, w: (None, w), 400, "invalid_config"),
    ("non_json_config", lambda c, w: (b"{not json", w), 400, "invalid_config"),
    ("config_not_an_object", lambda c, w: (b"[1, 2]", w), 400, "invalid_config"),
    (
        "config_missing_r",
        lambda c, w: (json.dumps({k: v for k, v in json.loads(c).items() if k != "r"}).encode(), w),
        400,
        "invalid_config",
    ),
    (
        "use_dora",
        lambda c, w: (json.dumps({**json.loads(c), "use_dora": True}).encode(), w),
        400,
        "invalid_config",
    ),
    (
        "modules_to_save",
        lambda c, w: (json.dumps({**json.loads(c), "modules_to_save": ["lm_head"]}).encode(), w),
        400,
        "invalid_config",
    ),
    ("config_over_limit", lambda c, w: (c[:-1] + b" " * 70_000 + b"}", w), 413, "config_too_large"),
    ("pickle_file", lambda c, w: (c, _pickle_bytes()), 400, "pickle_refused"),
    ("missing_weights", lambda c, w: (c, None), 400, "missing_file"),
    ("empty_weights", lambda c, w: (c, b""), 400, "invalid_safetensors"),
]


def _assert_nothing_left(
    client: TestClient, headers: dict, name: str, s3_client, bucket: str, tenant_id: str
) -> None:
    assert client.get(f"/v1/adapters/{name}", headers=headers).status_code == 404
    assert client.get("/v1/adapters", headers=headers).json()["data"] == []
    assert tenant_keys(s3_client, bucket, tenant_id) == []


@pytest.mark.parametrize(
    ("case", "make", "status", "code"), SYNC_REFUSALS, ids=[c[0] for c in SYNC_REFUSALS]
)
def test_refused_at_upload(
    case: str,
    make,
    status: int,
    code: str,
    client: TestClient,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    tenant_id, headers = make_tenant()
    config, weights = make(*adapter_files(adapter_r4))
    resp = upload(client, headers, "bad", base_model, config, weights)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == code and err["message"]
    _assert_nothing_left(client, headers, "bad", s3_client, cp_settings.s3_bucket, tenant_id)


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", "x" * 65, "sp ace", ".hidden", ""])
def test_bad_names_are_refused(
    name: str,
    client: TestClient,
    base_model: str,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    tenant_id, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    resp = upload(client, headers, name, base_model, config, weights)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] in ("invalid_name", "missing_field")
    assert tenant_keys(s3_client, cp_settings.s3_bucket, tenant_id) == []
    assert client.get("/v1/adapters", headers=headers).json()["data"] == []


def test_unknown_base_model_is_404(
    client: TestClient, base_model: str, make_tenant, adapter_r4: Path, cp_settings, s3_client
) -> None:
    tenant_id, headers = make_tenant()
    resp = upload(client, headers, "ok", "no-such-model", *adapter_files(adapter_r4))
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "base_model"
    _assert_nothing_left(client, headers, "ok", s3_client, cp_settings.s3_bucket, tenant_id)


@pytest.mark.parametrize(("case", "make", "reason"), JOB_FAILURES, ids=[c[0] for c in JOB_FAILURES])
def test_failed_by_validation_job(
    case: str,
    make,
    reason: str,
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    tenant_id, headers = make_tenant()
    config, weights = make(*adapter_files(adapter_r4))
    resp = upload(client, headers, "bad", base_model, config, weights)
    assert resp.status_code == 202, resp.text
    version = wait_for_version(client, headers, "bad", 1)
    assert version["status"] == "failed"
    assert reason in version["error"], version["error"]
    assert version["sha256"] is None and version["rank"] is None
    latest = client.get("/v1/adapters/bad", headers=headers).json()
    assert latest["status"] == "failed" and latest["error"] == version["error"]
    assert tenant_keys(s3_client, cp_settings.s3_bucket, tenant_id) == []


def test_rank_over_the_deployment_limit_fails(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r16: Path,
    cp_settings,
    s3_client,
) -> None:
    tenant_id, headers = make_tenant()
    assert (
        upload(client, headers, "big", base_model, *adapter_files(adapter_r16)).status_code == 202
    )
    version = wait_for_version(client, headers, "big", 1)
    assert version["status"] == "failed"
    assert "rank 16" in version["error"] and "limit of 8" in version["error"]
    assert tenant_keys(s3_client, cp_settings.s3_bucket, tenant_id) == []


@pytest.fixture(scope="module")
def small_client(cp_settings) -> TestClient:
    from loraplex.api.app import create_app

    small = cp_settings.model_copy(update={"max_adapter_bytes": 4096})
    with TestClient(create_app(small), raise_server_exceptions=False) as c:
        yield c


def test_body_over_the_size_limit_is_413(
    small_client: TestClient, base_model: str, make_tenant, adapter_r4: Path, cp_settings, s3_client
) -> None:
    tenant_id, headers = make_tenant()
    config, _ = adapter_files(adapter_r4)
    # one file over the per-file limit, the body under the whole-request cap
    resp = upload(small_client, headers, "huge", base_model, config, bytes(8192))
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "file_too_large"
    # a body whose Content-Length is over the whole-request cap: refused before reading it
    resp = upload(small_client, headers, "huge", base_model, config, bytes(3 << 20))
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    # a chunked body (no Content-Length) that grows past the cap mid-stream

    def chunks():
        yield b'--b\r\nContent-Disposition: form-data; name="adapter_model"; filename="x"\r\n\r\n'
        for _ in range(40):
            yield bytes(1 << 16)

    resp = small_client.post(
        "/v1/adapters",
        content=chunks(),
        headers={**headers, "Content-Type": "multipart/form-data; boundary=b"},
    )
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"
    _assert_nothing_left(small_client, headers, "huge", s3_client, cp_settings.s3_bucket, tenant_id)


def test_presigned_upload_refuses_oversize_and_pickles(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
    s3_client,
) -> None:
    import httpx

    tenant_id, headers = make_tenant()
    config, _ = adapter_files(adapter_r4)
    too_big = client.post(
        "/v1/adapters/p/uploads",
        headers=headers,
        json={
            "base_model": base_model,
            "adapter_config": json.loads(config),
            "size": cp_settings.max_adapter_bytes + 1,
        },
    )
    assert too_big.status_code == 413
    pickled = _pickle_bytes()
    plan = client.post(
        "/v1/adapters/p/uploads",
        headers=headers,
        json={"base_model": base_model, "adapter_config": json.loads(config), "size": len(pickled)},
    )
    assert plan.status_code == 201, plan.text
    plan = plan.json()
    etag = httpx.put(plan["parts"][0]["url"], content=pickled, timeout=30).headers["ETag"]
    done = client.post(
        f"/v1/adapters/p/uploads/{plan['upload_id']}/complete",
        headers=headers,
        json={"parts": [{"part_number": 1, "etag": etag}]},
    )
    assert done.status_code == 202
    version = wait_for_version(client, headers, "p", 1)
    assert version["status"] == "failed" and "pickle" in version["error"]
    assert tenant_keys(s3_client, cp_settings.s3_bucket, tenant_id) == []


def test_storage_failure_is_a_503_without_storage_internals(
    cp_settings, base_model: str, make_tenant, adapter_r4: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Object storage down: the tenant gets a 503 and a request id; the storage error (its
    endpoint, the exception) is only in the log under that id."""
    import socket

    from loraplex.api.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed when the block ends
    broken = cp_settings.model_copy(update={"s3_endpoint_url": dead})
    _, headers = make_tenant()
    with TestClient(create_app(broken), raise_server_exceptions=False) as c:
        resp = upload(c, headers, "stored", base_model, *adapter_files(adapter_r4))
        left = c.get("/v1/adapters/stored", headers=headers)
    assert left.status_code == 404, (resp.text, left.text)  # no row left
    assert resp.status_code == 503, resp.text
    rid = resp.headers["x-request-id"]
    err = resp.json()["error"]
    assert err["code"] == "storage_unavailable" and rid in err["message"]
    for internal in (dead, "127.0.0.1", "Could not connect", "EndpointConnectionError"):
        assert internal not in resp.text
    assert rid in caplog.text and dead in caplog.text
