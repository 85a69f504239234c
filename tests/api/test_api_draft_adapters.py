"""Draft adapters through the control plane (issue 25): a tenant uploads a small LoRA for a
deployment's draft model, tied to one of its adapter versions; a real Celery job validates it
against the draft model (not the base); the gateway's resolution carries it to the replica on
the target adapter's reference, and a replica drafting with that model drafts the target's
requests with it. Refused: a deployment without a draft model, another tenant's adapter, a
second live draft adapter for the same version and draft model."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.peft_adapters import peft_adapter_dir
from support.uploads import adapter_files, upload, wait_for_version
from support.waiting import wait_until

from loraplex.bench._synthetic.models import save_random_model


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> dict[str, Path]:
    """Two draft models sharing the base's vocabulary: a copy of the base, and a smaller one
    (hidden 32: an adapter shaped for the base does not fit it); a draft adapter for each."""
    copy = tmp_path_factory.mktemp("draft-copy") / "m"
    shutil.copytree(tiny_llama, copy)
    small = tmp_path_factory.mktemp("draft-small")
    save_random_model(small, "llama", seed=3, init="hf", vocab_size=256, hidden_size=32,
                      intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    small_adapter = peft_adapter_dir(small, tmp_path_factory.mktemp("da-small"), r=2, alpha=4)
    return {"copy": copy, "small": small, "small_adapter": small_adapter}


@pytest.fixture(scope="module")
def spec_deployments(client: TestClient, admin_headers: dict, base_model: str, drafts) -> dict:
    """Deployments of the base: drafting with the copy (draft adapters on), with the small
    model, and one speculating by n-gram only."""
    out = {}
    for name, spec in (
        ("dep-draft-copy", {"method": "draft_adapter", "draft_model": str(drafts["copy"])}),
        ("dep-draft-small", {"method": "draft_adapter", "draft_model": str(drafts["small"])}),
        ("dep-ngram", {"method": "ngram"}),
    ):
        body = {"name": name, "base_model": base_model, "max_lora_rank": 8, "speculative": spec}
        resp = client.post("/admin/v1/deployments", headers=admin_headers, json=body)
        assert resp.status_code == 201, resp.text
        out[name] = resp.json()
    return out


def upload_draft(client: TestClient, headers: dict, name: str, n: int, deployment: str,
                 adapter_dir: Path) -> Any:  # fmt: skip
    config, weights = adapter_files(adapter_dir)
    return client.post(
        f"/v1/adapters/{name}/versions/{n}/drafts",
        headers=headers,
        data={"deployment": deployment},
        files={
            "adapter_config": ("adapter_config.json", config, "application/json"),
            "adapter_model": ("adapter_model.safetensors", weights, "application/octet-stream"),
        },
    )


def wait_for_draft(client: TestClient, headers: dict, name: str, n: int, draft_id: str) -> dict:
    def done() -> dict | None:
        r = client.get(f"/v1/adapters/{name}/versions/{n}/drafts", headers=headers)
        assert r.status_code == 200, r.text
        row = next(d for d in r.json()["data"] if d["id"] == draft_id)
        return row if row["status"] in ("ready", "failed") else None

    return wait_until(done, timeout=60, interval=0.2, what=f"draft adapter {draft_id}")


def resolved_ref(cp_settings: Any, tenant_id: str, model: str) -> Any:
    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.gateway.resolve import adapter_ref, resolve_uncached

    with make_sessionmaker(cp_settings.database_url)() as session:
        resolved = resolve_uncached(session, uuid.UUID(tenant_id), model)
    return adapter_ref(resolved, uuid.UUID(tenant_id))


def _ready_adapter(client: TestClient, headers: dict, base_model: str, adapter_dir: Path) -> None:
    config, weights = adapter_files(adapter_dir)
    assert upload(client, headers, "bot", base_model, config, weights).status_code == 202
    assert wait_for_version(client, headers, "bot", 1)["status"] == "ready"


def test_a_draft_adapter_is_validated_against_the_draft_model_and_reaches_the_replica(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    spec_deployments: dict,
    make_tenant,
    adapter_r4: Path,
    drafts: dict,
    cp_settings,
) -> None:
    tenant, headers = make_tenant()
    _ready_adapter(client, headers, base_model, adapter_r4)

    # For the small draft model: its own adapter is ready, the base-shaped one fails.
    resp = upload_draft(client, headers, "bot", 1, "dep-draft-small", drafts["small_adapter"])
    assert resp.status_code == 202, resp.text
    small = resp.json()
    assert small["status"] == "validating" and small["draft_model"] == str(drafts["small"])
    got = wait_for_draft(client, headers, "bot", 1, small["id"])
    assert got["status"] == "ready" and got["rank"] == 2, got

    resp = upload_draft(client, headers, "bot", 1, "dep-draft-copy", adapter_r4)
    assert resp.status_code == 202, resp.text
    assert wait_for_draft(client, headers, "bot", 1, resp.json()["id"])["status"] == "ready"

    # A second draft adapter for the same version and draft model: 409 until deleted.
    again = upload_draft(client, headers, "bot", 1, "dep-draft-copy", adapter_r4)
    assert again.status_code == 409 and again.json()["error"]["code"] == "draft_adapter_exists"

    ref = resolved_ref(cp_settings, tenant, "bot")
    by_model = {d.draft_model: d for d in ref.drafts or []}
    assert set(by_model) == {str(drafts["copy"]), str(drafts["small"])}
    assert by_model[str(drafts["small"])].sha256 == small["sha256"]
    # The wire carries it strictly: the reference round-trips, an unknown field is refused.
    from pydantic import ValidationError

    from loraplex.platform.wire import AdapterRef

    assert AdapterRef.model_validate_json(ref.model_dump_json()) == ref
    bad = ref.model_dump()
    bad["drafts"][0]["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        AdapterRef.model_validate(bad)

    # The base-shaped adapter does not fit the small draft model: refused by validation.
    delete = client.delete(f"/v1/adapters/bot/versions/1/drafts/{small['id']}", headers=headers)
    assert delete.status_code == 200, delete.text
    resp = upload_draft(client, headers, "bot", 1, "dep-draft-small", adapter_r4)
    assert resp.status_code == 202, resp.text
    failed = wait_for_draft(client, headers, "bot", 1, resp.json()["id"])
    assert failed["status"] == "failed" and "shape" in failed["error"], failed
    ref = resolved_ref(cp_settings, tenant, "bot")
    assert [d.draft_model for d in ref.drafts or []] == [str(drafts["copy"])]


def test_draft_adapters_count_toward_the_tenants_stored_bytes(
    client: TestClient,
    worker,
    admin_headers: dict,
    base_model: str,
    deployment: dict,
    spec_deployments: dict,
    make_tenant,
    adapter_r4: Path,
) -> None:
    """A draft adapter's objects are the tenant's stored bytes like any adapter's: shown on
    `/v1/limits`, and an upload past the limit with them counted is refused."""
    tenant, headers = make_tenant()
    config, weights = adapter_files(adapter_r4)
    cap = len(weights) * 5 // 2
    client.patch(
        f"/admin/v1/tenants/{tenant}", headers=admin_headers,
        json={"max_stored_adapter_bytes": cap},
    )  # fmt: skip
    _ready_adapter(client, headers, base_model, adapter_r4)
    resp = upload_draft(client, headers, "bot", 1, "dep-draft-copy", adapter_r4)
    assert resp.status_code == 202, resp.text
    assert wait_for_draft(client, headers, "bot", 1, resp.json()["id"])["status"] == "ready"
    used = client.get("/v1/limits", headers=headers).json()["stored_adapter_bytes"]["used"]
    assert used == 2 * len(weights)
    refused = upload(client, headers, "third", base_model, config, weights)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "storage_limit_exceeded"


def test_a_draft_adapter_whose_validation_was_lost_is_requeued(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    spec_deployments: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
) -> None:
    """Recovery re-enqueues a draft adapter stuck in `validating` (its job's message lost, or
    its worker killed), as it does an adapter version: none is left validating for good."""
    import io

    from support.uploads import service_uploader

    from loraplex.platform.jobs.recovery import recover
    from loraplex.platform.services.draft_adapters import upload_draft_adapter

    tenant, headers = make_tenant()
    _ready_adapter(client, headers, base_model, adapter_r4)
    config, weights = adapter_files(adapter_r4)
    nowhere = service_uploader(
        cp_settings, uuid.UUID(tenant), queue=f"nobody-{uuid.uuid4().hex[:6]}"
    )
    row = upload_draft_adapter(
        nowhere, "bot", 1, "dep-draft-copy", config, io.BytesIO(weights), len(weights)
    )
    assert row.status == "validating"
    up = service_uploader(cp_settings, uuid.UUID(tenant))
    assert recover(cp_settings, up.dispatcher, older_than_s=0).requeued_versions
    assert wait_for_draft(client, headers, "bot", 1, str(row.id))["status"] == "ready"


def test_a_deployment_without_a_draft_model_refuses_draft_adapters(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    spec_deployments: dict,
    make_tenant,
    adapter_r4: Path,
) -> None:
    _, headers = make_tenant()
    _ready_adapter(client, headers, base_model, adapter_r4)
    for dep, says in (("tiny-dep", "does not speculate"), ("dep-ngram", "'ngram'")):
        resp = upload_draft(client, headers, "bot", 1, dep, adapter_r4)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["code"] == "no_draft_model" and err["param"] == "deployment", err
        assert "has no draft model" in err["message"] and says in err["message"], err
    resp = upload_draft(client, headers, "bot", 1, "no-such-dep", adapter_r4)
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "deployment"


def test_a_tenant_cannot_tie_a_draft_adapter_to_another_tenants_adapter(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    spec_deployments: dict,
    make_tenant,
    adapter_r4: Path,
    cp_settings,
) -> None:
    owner, owner_headers = make_tenant()
    _ready_adapter(client, owner_headers, base_model, adapter_r4)
    other, other_headers = make_tenant()
    # The other tenant has no adapter of that name: the owner's is invisible, a 404.
    resp = upload_draft(client, other_headers, "bot", 1, "dep-draft-copy", adapter_r4)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "adapter_not_found"
    # With an adapter of the same name of its own, its draft adapter ties to its own only.
    _ready_adapter(client, other_headers, base_model, adapter_r4)
    resp = upload_draft(client, other_headers, "bot", 1, "dep-draft-copy", adapter_r4)
    assert resp.status_code == 202, resp.text
    assert wait_for_draft(client, other_headers, "bot", 1, resp.json()["id"])["status"] == "ready"
    assert resolved_ref(cp_settings, owner, "bot").drafts is None
    assert len(resolved_ref(cp_settings, other, "bot").drafts or []) == 1
    # Nor can it list or delete the owner's (the owner's draft list is its own).
    owned = client.get("/v1/adapters/bot/versions/1/drafts", headers=owner_headers).json()
    assert owned["data"] == []


def test_a_replica_drafts_the_target_adapters_requests_with_the_tied_draft_adapter(
    client: TestClient,
    worker,
    base_model: str,
    deployment: dict,
    spec_deployments: dict,
    make_tenant,
    adapter_r4: Path,
    drafts: dict,
    cp_settings,
    tiny_llama: Path,
) -> None:
    """End to end: the draft model is a copy of the base and the tied draft adapter a copy of
    the target adapter, so every greedy draft of the target's requests is accepted when the
    replica drafts with it (the reference the gateway resolved); with the same reference
    stripped of its drafts, the plain draft model drafts and few are."""
    import json

    from loraplex.loader.object_store import ObjectStore
    from loraplex.platform.engine import LLM, SamplingParams
    from loraplex.platform.engine.lora import LoraRuntime

    tenant, headers = make_tenant()
    _ready_adapter(client, headers, base_model, adapter_r4)
    resp = upload_draft(client, headers, "bot", 1, "dep-draft-copy", adapter_r4)
    assert resp.status_code == 202, resp.text
    assert wait_for_draft(client, headers, "bot", 1, resp.json()["id"])["status"] == "ready"
    ref = resolved_ref(cp_settings, tenant, "bot")
    assert ref.drafts is not None and len(ref.drafts) == 1

    option = {"method": "draft_adapter", "draft_model": str(drafts["copy"]), "k_min": 3,
              "k_max": 3}  # fmt: skip
    # With k_min 3 and the draft guard's floor above the batch, every step drafts (the guard
    # would judge a draft model's speed here, which this test is not about).
    prompts = [[(7 * i + 3 * j) % 200 + 10 for j in range(12)] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def run(with_drafts: bool) -> tuple[Any, list[list[int]]]:
        storage = cp_settings.storage()
        llm = LLM(str(tiny_llama), block_size=4, max_num_batched_tokens=256, max_num_seqs=8,
                  max_loras=2, max_lora_rank=8, speculative=json.dumps(option),
                  storage=storage)  # fmt: skip
        core = llm.core
        core.speculator.guard.min_batch = len(prompts) + 1
        core.install_lora_runtime(LoraRuntime.for_engine(
            core, object_store=ObjectStore(storage), allow_local_paths=False))  # fmt: skip
        sent = ref if with_drafts else ref.model_copy(update={"drafts": None})
        outs = llm.generate(prompts, params, adapters=[sent] * len(prompts))
        return core.speculator, [o.outputs[0].token_ids for o in outs]

    spec, tied_out = run(with_drafts=True)
    assert spec is not None and spec.drafter is not None and spec.drafter.adapters is not None
    assert spec.drafter.adapters.key_for(ref.key) == ref.drafts[0].key
    tied = spec.stats[ref.key]
    assert tied.drafted > 50 and tied.accepted == tied.drafted, tied

    spec, plain_out = run(with_drafts=False)
    assert spec is not None and spec.drafter is not None and spec.drafter.adapters is not None
    assert spec.drafter.adapters.key_for(ref.key) is None
    plain = spec.stats[ref.key]
    assert plain.accepted < 0.8 * plain.drafted, plain
    assert tied_out == plain_out  # greedy: the same tokens either way
