"""The operator CLI end to end against a running API: tenants -> keys -> push -> list/show
-> delete, deployments, and the server's error messages on failure (non-zero exit)."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import httpx
from support.opcli import OperatorShell


def _tenant(shell: OperatorShell, name: str) -> dict:
    return json.loads(shell.ok("tenants", "create", name, "--rpm", "600", "--json").stdout)


def test_tenants_create_list_limits(op_stack) -> None:
    shell = op_stack.shell()
    name = f"acme-{uuid.uuid4().hex[:6]}"
    out = shell.ok("tenants", "create", name, "--tpm", "5000")
    assert name in out.stdout and "tokens_per_minute: 5000" in out.stdout
    listed = json.loads(shell.ok("tenants", "list", "--json").stdout)
    tenant = {t["name"]: t for t in listed}[name]
    assert tenant["limits"]["tokens_per_minute"] == 5000
    table = shell.ok("tenants", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "NAME", "RPM"]
    assert any(line.startswith(tenant["id"]) and name in line for line in table[1:])
    # by name or by id; `default` resets one limit, the others stay
    shell.ok("tenants", "limits", name, "--rpm", "120", "--monthly-quota", "1000000")
    got = json.loads(
        shell.ok("tenants", "limits", tenant["id"], "--tpm", "default", "--json").stdout
    )
    assert got["limits"]["requests_per_minute"] == 120
    assert got["limits"]["monthly_token_quota"] == 1_000_000
    assert got["limits"]["tokens_per_minute"] is None
    shown = shell.ok("tenants", "limits", name).stdout
    assert "requests_per_minute: 120" in shown and "tokens_per_minute: default" in shown
    # the server's own messages, non-zero exit
    dup = shell.fails("tenants", "create", name)
    assert f"a tenant named {name!r} exists already" in dup.stderr
    bad = shell.fails("tenants", "limits", name, "--rpm", "-5")
    assert "requests_per_minute" in bad.stderr
    assert shell.fails("tenants", "limits", "nobody-here").stderr.strip() == (
        "error: no tenant named or with id 'nobody-here'"
    )
    missing = shell.fails("tenants", "limits", str(uuid.uuid4()))
    assert "no tenant with id" in missing.stderr


def test_bad_or_missing_admin_key_is_refused(op_stack) -> None:
    bad = OperatorShell(op_stack.url, "lpx-wrong-key")
    out = bad.fails("tenants", "list")
    assert out.returncode == 1 and "admin" in out.stderr.lower()
    nokey = OperatorShell(op_stack.url, "")
    assert "LORAPLEX_ADMIN_KEY is not set" in nokey.fails("tenants", "list").stderr
    down = OperatorShell("http://127.0.0.1:9", op_stack.settings.admin_key)
    assert "cannot reach the API at http://127.0.0.1:9" in down.fails("tenants", "list").stderr


def test_whole_flow_tenant_key_push_list_show_delete(op_stack, tmp_path: Path) -> None:
    shell = op_stack.shell()
    name = f"flow-{uuid.uuid4().hex[:6]}"
    tenant = _tenant(shell, name)
    created = shell.ok("keys", "create", name, "--name", "laptop").stdout
    assert "shown only now" in created
    secret = shell.ok("keys", "create", tenant["id"], "--quiet").stdout.strip()
    assert secret.startswith("lp") and " " not in secret
    keys = json.loads(shell.ok("keys", "list", name, "--json").stdout)
    assert {k["name"] for k in keys} == {"laptop", "cli"}
    assert all("key" not in k for k in keys)  # no secret is ever listed

    adapter = Path(shell.ok("demo", "adapter", "--out", str(tmp_path / "ad")).stdout.strip())
    tenant_shell = op_stack.shell(api_key=secret)
    pushed = tenant_shell.ok(
        "adapters", "push", str(adapter), "--name", "support-bot", "--base-model", "demo"
    )
    assert "support-bot v1 is ready (rank 8, targets q_proj,v_proj)" in pushed.stdout
    again = tenant_shell.ok(
        "adapters", "push", str(adapter), "--name", "support-bot", "--base-model", "demo",
        "--json",
    )  # fmt: skip
    assert json.loads(again.stdout)["version"] == 2

    table = tenant_shell.ok("adapters", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "BASE_MODEL", "VERSION", "STATUS"]
    assert table[1].split()[:4] == ["support-bot", "demo", "2", "ready"]
    shown = tenant_shell.ok("adapters", "show", "support-bot").stdout
    sha = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes())
    assert f"sha256          {sha.hexdigest()}" in shown and "status          ready" in shown
    v1 = json.loads(tenant_shell.ok("adapters", "show", "support-bot", "--version", "1",
                                    "--json").stdout)  # fmt: skip
    assert v1["version"] == 1 and v1["rank"] == 8 and v1["status"] == "ready"
    nine = tenant_shell.fails("adapters", "show", "support-bot", "--version", "9")
    assert nine.stderr.strip() == "error: adapter 'support-bot' has no version 9"

    # another tenant sees none of it
    other = _tenant(shell, f"other-{uuid.uuid4().hex[:6]}")
    other_key = shell.ok("keys", "create", other["id"], "-q").stdout.strip()
    assert op_stack.shell(api_key=other_key).ok("adapters", "list", "--json").stdout.strip() == "[]"
    hidden = op_stack.shell(api_key=other_key).fails("adapters", "show", "support-bot")
    assert hidden.stderr.strip() == "error: no adapter named 'support-bot'"

    deleted = tenant_shell.ok("adapters", "delete", "support-bot").stdout
    assert deleted.startswith("deleted adapter support-bot")
    assert json.loads(tenant_shell.ok("adapters", "list", "--json").stdout) == []
    gone = tenant_shell.fails("adapters", "show", "support-bot")
    assert gone.stderr.strip() == "error: no adapter named 'support-bot'"

    # revoke: the key stops working at once, with the server's message
    key_id = {k["name"]: k["id"] for k in keys}["cli"]
    assert f"revoked key {key_id}" in shell.ok("keys", "revoke", key_id).stdout
    refused = tenant_shell.fails("adapters", "list")
    direct = httpx.get(f"{op_stack.url}/v1/adapters", headers={"Authorization": f"Bearer {secret}"})
    assert direct.status_code == 401
    assert refused.stderr.strip() == f"error: {direct.json()['error']['message']}"
    missing_id = str(uuid.uuid4())
    unknown = shell.fails("keys", "revoke", missing_id)
    assert unknown.stderr.strip() == f"error: no API key with id {missing_id}"
    assert "LORAPLEX_API_KEY is not set" in shell.fails("adapters", "list").stderr


def test_push_refuses_a_folder_without_the_files(op_stack, tmp_path: Path) -> None:
    shell = op_stack.shell(api_key="lp_unused")
    (tmp_path / "adapter_config.json").write_text("{}")
    out = shell.fails("adapters", "push", str(tmp_path), "--name", "x", "--base-model", "demo")
    assert "has no adapter_model.safetensors" in out.stderr


def test_deployments_create_list_scale(op_stack) -> None:
    shell = op_stack.shell()
    dep = json.loads(
        shell.ok("deployments", "create", "demo-dep", "--base-model", "demo", "--weights", "fp32",
                 "--max-lora-rank", "1024", "--replicas", "0", "--json").stdout
    )  # fmt: skip
    assert dep["replicas"] == 0 and dep["quantization"]["weights"] == "fp32"
    assert (
        "demo-dep: 2 replicas"
        in shell.ok("deployments", "scale", "demo-dep", "--replicas", "2").stdout
    )
    listed = shell.ok("deployments", "list").stdout.splitlines()
    row = next(line for line in listed if line.startswith(dep["id"]))
    assert row.split()[1:3] == ["demo-dep", "demo"] and row.split()[-1] == "2"
    bad = shell.fails("deployments", "scale", dep["id"], "--replicas", "-1")
    assert "replicas must be an integer in 0..1024, got -1" in bad.stderr
    assert (
        "no deployment named or with id 'nope'"
        in shell.fails("deployments", "scale", "nope", "--replicas", "1").stderr
    )
    assert (
        "no deployment with id"
        in shell.fails("deployments", "scale", str(uuid.uuid4()), "--replicas", "1").stderr
    )
    unserved = shell.fails(
        "deployments", "create", "q", "--base-model", "demo", "--weights", "int4"
    )
    # The demo model's MLP width (688) is not a multiple of int4's 128-input groups.
    assert "int4 quantizes in groups of 128" in unserved.stderr
    assert "int8 or fp8 would work" in unserved.stderr
    assert shell.ok("deployments", "scale", "demo-dep", "--replicas", "0", "--json").stdout
    routed = shell.ok("deployments", "route", "demo-dep", "--weight", "3", "--nameable").stdout
    assert "demo-dep: weight 3.0, nameable true" in routed
    assert "by capacity" in shell.ok("deployments", "route", "demo-dep", "--by-capacity").stdout
    bad_weight = shell.fails("deployments", "route", "demo-dep", "--weight", "-2")
    assert "routing_weight" in bad_weight.stderr
    # The tool-call format (how `auto` tool calls are read): a format, or back to the template.
    tools = shell.ok("deployments", "tools", "demo-dep", "--format", "llama3_json").stdout
    assert "demo-dep: tool calls read as llama3_json" in tools
    back = shell.ok("deployments", "tools", "demo-dep", "--from-template").stdout
    assert "demo-dep: tool calls read as the chat template teaches" in back
    bad_format = shell.fails("deployments", "tools", "demo-dep", "--format", "mistral")
    assert "tool_call_format must be null" in bad_format.stderr
