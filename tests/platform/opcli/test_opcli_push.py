"""`loraplex adapters push` of a 64 MiB adapter through presigned S3 multipart with progress,
and a failing validation's message shown to the operator with a non-zero exit."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from pathlib import Path

from support.opcli import OperatorShell

PART = 8 << 20  # the API's smallest part (platform/services/adapters.py MIN_PART)


def _tenant_shell(op_stack) -> OperatorShell:
    shell = op_stack.shell()
    name = f"push-{uuid.uuid4().hex[:6]}"
    shell.ok("tenants", "create", name)
    return op_stack.shell(api_key=shell.ok("keys", "create", name, "-q").stdout.strip())


def _s3_weights(op_stack, adapter_id: str) -> dict:
    """HEAD of the adapter's one stored weights object."""
    from loraplex.platform.services import objects

    client = objects.s3_client(op_stack.settings)
    bucket = op_stack.settings.s3_bucket
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="tenants/")
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])]
    weights = [k for k in keys if adapter_id in k and k.endswith(".safetensors")]
    assert len(weights) == 1, keys
    return client.head_object(Bucket=bucket, Key=weights[0])


def test_push_64mib_adapter_through_presigned_multipart(op_stack, tmp_path: Path) -> None:
    shell = _tenant_shell(op_stack)
    # rank 908 on every projection of the demo model: just over 64 MiB of float32
    folder = Path(
        shell.ok("demo", "adapter", "--out", str(tmp_path / "big"), "--rank", "908",
                 "--targets", "all").stdout.strip()
    )  # fmt: skip
    weights = folder / "adapter_model.safetensors"
    size = weights.stat().st_size
    assert 64 << 20 <= size < 65 << 20, size
    parts = -(-size // PART)
    out = shell.ok(
        "adapters", "push", str(folder), "--name", "big", "--base-model", "demo", timeout=600
    )
    assert "big v1 is ready (rank 908" in out.stdout, out.stdout + out.stderr
    progress = re.findall(r"big v1: part (\d+)/(\d+) uploaded, ([\d.]+)/([\d.]+) MiB \((\d+)%\)",
                          out.stderr)  # fmt: skip
    assert [int(p[0]) for p in progress] == list(range(1, parts + 1)), out.stderr
    assert {int(p[1]) for p in progress} == {parts}
    pcts = [int(p[4]) for p in progress]
    assert pcts == sorted(pcts) and pcts[-1] == 100 and pcts[0] < 20
    # S3 assembled it from `parts` parts (a multipart object's ETag ends in -<part count>)
    shown = json.loads(shell.ok("adapters", "show", "big", "--json").stdout)
    assert shown["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert shown["bytes"] == size
    head = _s3_weights(op_stack, shown["adapter_id"])
    assert head["ContentLength"] == size
    assert head["ETag"].strip('"').endswith(f"-{parts}"), head["ETag"]


def test_small_push_is_one_request_unless_presigned_is_asked(op_stack, tmp_path: Path) -> None:
    shell = _tenant_shell(op_stack)
    folder = Path(shell.ok("demo", "adapter", "--out", str(tmp_path / "a")).stdout.strip())
    direct = shell.ok("adapters", "push", str(folder), "--name", "a", "--base-model", "demo")
    assert "part " not in direct.stderr and "a v1 is ready" in direct.stdout
    forced = shell.ok(
        "adapters", "push", str(folder), "--name", "a", "--base-model", "demo", "--presigned"
    )
    assert "a v2: part 1/1 uploaded" in forced.stderr and "a v2 is ready" in forced.stdout
    # on a terminal the progress is a live bar instead of lines
    tty = OperatorShell(shell.url, shell.admin_key, shell.api_key, {"FORCE_COLOR": "1"})
    bar = tty.ok("adapters", "push", str(folder), "--name", "a", "--base-model", "demo",
                 "--presigned")  # fmt: skip
    assert "a v3 (1 part)" in bar.stderr and "\x1b[" in bar.stderr, bar.stderr
    assert "part 1/1 uploaded" not in bar.stderr and "a v3 is ready" in bar.stdout


def test_failed_validation_message_and_exit(op_stack, tmp_path: Path, demo_model_dir) -> None:
    shell = _tenant_shell(op_stack)
    # an adapter made for another model's shape (hidden 64): the worker's shape check fails it
    other = tmp_path / "other-model"
    other.mkdir()
    config = json.loads((demo_model_dir / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 64, "head_dim": 8}))
    folder = Path(
        shell.ok(
            "demo", "adapter", "--out", str(tmp_path / "wrong"), "--model", str(other)
        ).stdout.strip()
    )
    out = shell.run("adapters", "push", str(folder), "--name", "wrong", "--base-model", "demo")
    assert out.returncode == 1, out.stdout + out.stderr
    shown = json.loads(shell.ok("adapters", "show", "wrong", "--json").stdout)
    assert shown["status"] == "failed" and "shape" in shown["error"]
    assert f"error: wrong v1 failed validation: {shown['error']}" in out.stderr
    assert "is ready" not in out.stdout
    # and a refusal at upload time (bad config) shows the API's 400 message
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    refused = shell.fails(
        "adapters", "push", str(folder), "--name", "wrong", "--base-model", "demo"
    )
    assert "missing 'r'" in refused.stderr
    good = shell.ok("demo", "adapter", "--out", str(tmp_path / "good")).stdout.strip()
    unknown_base = shell.fails("adapters", "push", good, "--name", "w2", "--base-model", "nope")
    assert "nope" in unknown_base.stderr, unknown_base.stderr
