"""A deployment's `speculative` option through the admin API (issue 25): stored and shown on
the deployment and on `/v1/models`' deployment entries; options the engine refuses (a method not
built, bad K bounds, expert parallelism) answer 400 naming `speculative`, storing nothing."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_speculative_deployment_is_stored_shown_and_checked(
    client: TestClient, admin_headers: dict, base_model: str
) -> None:
    body = {"name": "spec-dep", "base_model": base_model,
            "speculative": {"method": "ngram", "k_max": 3}}  # fmt: skip
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=body)
    assert resp.status_code == 201, resp.text
    assert resp.json()["speculative"] == {"method": "ngram", "k_min": 0, "k_max": 3}
    listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
    shown = {d["name"]: d["speculative"] for d in listed}
    assert shown["spec-dep"] == {"method": "ngram", "k_min": 0, "k_max": 3}
    plain = {"name": "spec-off", "base_model": base_model}
    resp = client.post("/admin/v1/deployments", headers=admin_headers, json=plain)
    assert resp.status_code == 201 and resp.json()["speculative"] is None

    for i, (spec, extra, says) in enumerate(
        [
            ({"method": "eagle"}, {}, "not built"),
            ({"method": "ngram", "k_min": 3, "k_max": 2}, {}, "K bounds"),
            ({"method": "ngram", "depth": 1}, {}, "unknown speculative option"),
            ({"method": "ngram"}, {"expert_parallel_size": 2}, "expert parallelism"),
        ]
    ):
        bad = {"name": f"spec-bad-{i}", "base_model": base_model, "speculative": spec, **extra}
        resp = client.post("/admin/v1/deployments", headers=admin_headers, json=bad)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == "speculative" and says in err["message"], err
    listed = client.get("/admin/v1/deployments", headers=admin_headers).json()["data"]
    assert not [d for d in listed if d["name"].startswith("spec-bad")]


def test_the_model_catalog_shows_the_option() -> None:
    from types import SimpleNamespace

    from loraplex.platform.services.model_catalog import deployment_entry

    row = SimpleNamespace(name="d", weight_quantization="fp32", kv_cache_dtype="auto",
                          deterministic=False, speculative={"method": "ngram", "k_max": 2})  # fmt: skip
    assert deployment_entry(row)["speculative"] == {"method": "ngram", "k_max": 2}
