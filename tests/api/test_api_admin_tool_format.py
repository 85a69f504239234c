"""The tool-call format as a deployment option (issue 24): how the gateway reads tool calls in a
model's free output under `tool_choice: "auto"`, when the chat template does not show it or
shows the wrong one. Stored, shown and changed through the admin API; an unknown format is
refused naming the field; null means "from the chat template"."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_tool_call_format_is_a_deployment_option(
    client: TestClient, admin_headers: dict, deployment: dict, base_model: str
) -> None:
    assert deployment["tool_call_format"] is None  # the default: read from the template
    body = {"name": "tools-dep", "base_model": base_model, "tool_call_format": "llama3_json"}
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=body)
    assert resp.status_code == 201, resp.text
    dep = resp.json()
    assert dep["tool_call_format"] == "llama3_json"
    listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
    assert {d["name"]: d["tool_call_format"] for d in listed}["tools-dep"] == "llama3_json"

    path = f"/admin/v1/deployments/{dep['id']}"
    resp = client.patch(path, headers=admin_headers, json={"tool_call_format": "qwen3_xml"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["tool_call_format"] == "qwen3_xml"
    assert resp.json()["replicas"] == dep["replicas"]  # nothing else changed
    resp = client.patch(path, headers=admin_headers, json={"tool_call_format": None})
    assert resp.status_code == 200 and resp.json()["tool_call_format"] is None


def test_an_unknown_tool_call_format_is_refused_by_name(
    client: TestClient, admin_headers: dict, deployment: dict, base_model: str
) -> None:
    body = {"name": "bad-tools", "base_model": base_model, "tool_call_format": "mistral"}
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=body)
    assert resp.status_code in (400, 422), resp.text
    err = resp.json()["error"]
    assert err["param"] == "tool_call_format"
    assert all(f in err["message"] for f in ("hermes", "llama3_json", "qwen3_xml")), err
    listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
    assert "bad-tools" not in {d["name"] for d in listed}
    path = f"/admin/v1/deployments/{deployment['id']}"
    resp = client.patch(path, headers=admin_headers, json={"tool_call_format": "mistral"})
    assert resp.status_code in (400, 422), resp.text
    assert resp.json()["error"]["param"] == "tool_call_format"
    assert "hermes" in resp.json()["error"]["message"]
