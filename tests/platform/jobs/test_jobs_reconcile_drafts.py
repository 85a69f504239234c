"""The orphan reconciler and deletions know draft adapters (issue 25): a draft adapter left
`deleting` by a storage failure is finished (objects, then row); a `failed` one still holding
objects is cleaned; objects under a version's `draft/` folder that no draft row owns are
orphans; a live draft adapter's objects are never touched. Deleting a version or an adapter
takes its draft adapters with it: marked `deleting` at once (not counted, not shown ready),
rows and objects gone once storage answers. Storage failures are a real client pointed at a
closed port, as the other reconciler tests do."""

from __future__ import annotations

import io
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from support.uploads import adapter_files

from loraplex.platform.db.models import AdapterVersion, DraftAdapter
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.jobs.adapter_checks import finish_validation
from loraplex.platform.jobs.reconcile import reconcile_objects
from loraplex.platform.jobs.validate import run_validation
from loraplex.platform.jobs.validate_draft import run_draft_validation
from loraplex.platform.services import adapters as svc
from loraplex.platform.services import admin_actions, objects
from loraplex.platform.services import draft_adapters as drafts_svc
from loraplex.platform.services.errors import Unavailable
from loraplex.platform.services.upload_limits import upload_usage

DEPLOYMENT = "dep-reconcile-drafts"


class _Nowhere:
    """A dispatcher that sends nothing: the test runs each job itself."""

    def __init__(self) -> None:
        self.sent: list[uuid.UUID] = []

    def send(self, kind: str, job_id: uuid.UUID) -> None:
        self.sent.append(job_id)


@pytest.fixture(scope="module")
def draft_deployment(
    cp_settings: Any, base_model: str, tiny_llama: Path, tmp_path_factory: Any
) -> str:
    """A deployment of the base model drafting with a copy of it (draft adapters on)."""
    from loraplex.platform.services.deployments import DeploymentSpec, create_deployment

    copy = tmp_path_factory.mktemp("draft-model") / "m"
    shutil.copytree(tiny_llama, copy)
    spec = DeploymentSpec(
        name=DEPLOYMENT,
        base_model=base_model,
        max_lora_rank=8,
        replicas=0,
        speculative={"method": "draft_adapter", "draft_model": str(copy)},
    )
    with session_scope(make_sessionmaker(cp_settings.database_url)) as s:
        create_deployment(s, cp_settings, spec)
    return DEPLOYMENT


def _uploader(settings: Any, tenant_id: uuid.UUID) -> svc.Uploader:
    return svc.Uploader(
        settings=settings,
        sessions=make_sessionmaker(settings.database_url),
        dispatcher=_Nowhere(),
        tenant_id=tenant_id,
        actor="test",
    )


def _broken(settings: Any) -> Any:
    """The same settings with object storage unreachable."""
    return settings.model_copy(update={"s3_endpoint_url": "http://127.0.0.1:9"})


def _ready_version_and_draft(
    cp_settings: Any, tenant_id: uuid.UUID, base_model: str, adapter_r4: Path, dep: str
) -> tuple[str, AdapterVersion, DraftAdapter]:
    """A ready version 1 of a fresh adapter and a ready draft adapter tied to it, each
    validated by its real job run in-process."""
    up = _uploader(cp_settings, tenant_id)
    name = f"bot-{uuid.uuid4().hex[:8]}"
    config, weights = adapter_files(adapter_r4)
    version = svc.upload_adapter(up, name, base_model, config, io.BytesIO(weights), len(weights))
    assert run_validation(cp_settings, up.dispatcher.sent[-1]) == "ready"  # type: ignore[attr-defined]
    draft = drafts_svc.upload_draft_adapter(
        up, name, 1, dep, config, io.BytesIO(weights), len(weights)
    )
    assert run_draft_validation(cp_settings, up.dispatcher.sent[-1]) == "ready"  # type: ignore[attr-defined]
    return name, version, draft


def _keys(cp_settings: Any, prefix: str) -> list[str]:
    return objects.list_keys(objects.s3_client(cp_settings), cp_settings.s3_bucket, prefix)


def _draft(cp_settings: Any, draft_id: uuid.UUID) -> DraftAdapter | None:
    with make_sessionmaker(cp_settings.database_url)() as s:
        return s.get(DraftAdapter, draft_id)


def test_a_draft_adapter_left_deleting_is_finished_by_the_reconciler(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
    draft_deployment: str,
) -> None:  # fmt: skip
    name, version, draft = _ready_version_and_draft(
        cp_settings, tenant_id, base_model, adapter_r4, draft_deployment
    )
    assert _keys(cp_settings, draft.object_prefix)
    # Storage is down for the deletion: the row stays, marked deleting, its objects stored.
    drafts_svc.delete_draft_adapter(_uploader(_broken(cp_settings), tenant_id), name, 1, draft.id)
    row = _draft(cp_settings, draft.id)
    assert row is not None and row.status == "deleting"
    assert _keys(cp_settings, draft.object_prefix)

    report = reconcile_objects(cp_settings)
    assert report.deleted_drafts == [draft.id]
    assert _draft(cp_settings, draft.id) is None
    assert _keys(cp_settings, draft.object_prefix) == []
    # The target version is untouched: its own files and its row stay.
    assert sorted(_keys(cp_settings, version.object_prefix)) == sorted(
        [version.config_key, version.weights_key]
    )
    with make_sessionmaker(cp_settings.database_url)() as s:
        assert s.get(AdapterVersion, version.id).status == "ready"  # type: ignore[union-attr]


def test_a_failed_draft_adapter_still_holding_objects_is_cleaned(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
    draft_deployment: str,
) -> None:  # fmt: skip
    up = _uploader(cp_settings, tenant_id)
    name = f"bot-{uuid.uuid4().hex[:8]}"
    config, weights = adapter_files(adapter_r4)
    svc.upload_adapter(up, name, base_model, config, io.BytesIO(weights), len(weights))
    assert run_validation(cp_settings, up.dispatcher.sent[-1]) == "ready"  # type: ignore[attr-defined]
    draft = drafts_svc.upload_draft_adapter(
        up, name, 1, draft_deployment, config, io.BytesIO(weights), len(weights)
    )
    # Its validation fails and the job's clean-up of its objects meets a storage failure: the
    # row is written failed (the job's own writer), the objects stay behind.
    assert finish_validation(
        cp_settings, up.dispatcher.sent[-1], DraftAdapter, draft.id,
        {"status": "failed", "error": "shape mismatch", "sha256": None},
        {"outcome": "failed", "code": "shape_mismatch"},
    )  # fmt: skip
    assert _keys(cp_settings, draft.object_prefix)

    report = reconcile_objects(cp_settings)
    assert report.cleaned_failed_drafts == [draft.id]
    assert _keys(cp_settings, draft.object_prefix) == []
    row = _draft(cp_settings, draft.id)
    assert row is not None and row.status == "failed"  # its reason stays for the tenant


def test_orphaned_draft_objects_are_removed_and_a_live_draft_adapters_kept(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
    draft_deployment: str,
) -> None:  # fmt: skip
    _, version, draft = _ready_version_and_draft(
        cp_settings, tenant_id, base_model, adapter_r4, draft_deployment
    )
    client = objects.s3_client(cp_settings)
    # Objects in the live version's draft folder that no draft row owns (a discarded upload
    # whose clean-up failed, a failed row replaced by a new upload before its clean-up).
    orphan = f"{version.object_prefix}draft/{uuid.uuid4()}/adapter_model.safetensors"
    objects.put_bytes(client, cp_settings.s3_bucket, orphan, b"left behind")
    assert orphan not in reconcile_objects(cp_settings).orphan_keys  # within the grace period
    assert objects.object_size(client, cp_settings.s3_bucket, orphan) is not None

    report = reconcile_objects(cp_settings, grace_s=0)
    assert orphan in report.orphan_keys
    assert objects.object_size(client, cp_settings.s3_bucket, orphan) is None
    live = [version.config_key, version.weights_key, draft.config_key, draft.weights_key]
    assert not set(live) & set(report.orphan_keys)
    for key in live:
        assert objects.object_size(client, cp_settings.s3_bucket, key) is not None, key


def test_deleting_a_version_takes_its_draft_adapters(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
    draft_deployment: str,
) -> None:  # fmt: skip
    _, version, draft = _ready_version_and_draft(
        cp_settings, tenant_id, base_model, adapter_r4, draft_deployment
    )
    factory = make_sessionmaker(cp_settings.database_url)
    _, stored_before = upload_usage(factory(), tenant_id)
    # The operator deletes the version while storage is down: refused as unavailable, the
    # version stays deleting and its draft adapter with it (no longer ready, no longer counted).
    with session_scope(factory) as s:
        tid, prefix, adapter_id = admin_actions.mark_version_deleting(s, version.id, actor="op")
    with pytest.raises(Unavailable), session_scope(factory) as s:
        admin_actions.finish_version_delete(
            _broken(cp_settings), s, version.id, tid, prefix, adapter_id
        )
    row = _draft(cp_settings, draft.id)
    assert row is not None and row.status == "deleting"
    with factory() as s:
        _, stored = upload_usage(s, tenant_id)
    assert stored == stored_before - (version.bytes or 0) - (draft.bytes or 0)

    report = reconcile_objects(cp_settings)
    assert version.id in report.deleted_versions
    assert _draft(cp_settings, draft.id) is None
    assert _keys(cp_settings, version.object_prefix) == []  # the draft's objects included

    # With storage up, one deletion removes the version and its draft adapters at once.
    _, version, draft = _ready_version_and_draft(
        cp_settings, tenant_id, base_model, adapter_r4, draft_deployment
    )
    with session_scope(factory) as s:
        tid, prefix, adapter_id = admin_actions.mark_version_deleting(s, version.id, actor="op")
    with session_scope(factory) as s:
        admin_actions.finish_version_delete(cp_settings, s, version.id, tid, prefix, adapter_id)
    assert _draft(cp_settings, draft.id) is None
    assert _keys(cp_settings, version.object_prefix) == []


def test_deleting_an_adapter_takes_its_draft_adapters(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
    draft_deployment: str,
) -> None:  # fmt: skip
    from loraplex.platform.jobs.delete import run_delete

    name, version, draft = _ready_version_and_draft(
        cp_settings, tenant_id, base_model, adapter_r4, draft_deployment
    )
    up = _uploader(cp_settings, tenant_id)
    adapter, job_id = svc.delete_adapter(up, name)
    row = _draft(cp_settings, draft.id)
    assert row is not None and row.status == "deleting"  # no longer tied, nor counted
    with pytest.raises(Exception, match="Could not connect|Connect"):
        run_delete(_broken(cp_settings), job_id)
    assert _keys(cp_settings, draft.object_prefix)

    report = reconcile_objects(cp_settings)
    assert adapter.id in report.deleted_adapters
    assert _draft(cp_settings, draft.id) is None
    assert _keys(cp_settings, svc.adapter_prefix(tenant_id, adapter.id)) == []
    with make_sessionmaker(cp_settings.database_url)() as s:
        assert (
            s.scalars(
                select(DraftAdapter).where(DraftAdapter.adapter_version_id == version.id)
            ).all()
            == []
        )


def test_a_draft_upload_whose_objects_cannot_be_removed_leaves_its_row_deleting(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
    draft_deployment: str,
) -> None:  # fmt: skip
    """An upload that failed to store its objects and then failed to remove them keeps its row
    (`deleting`) for the reconciler: no object is left without a row that points to it."""
    up = _uploader(cp_settings, tenant_id)
    name = f"bot-{uuid.uuid4().hex[:8]}"
    config, weights = adapter_files(adapter_r4)
    version = svc.upload_adapter(up, name, base_model, config, io.BytesIO(weights), len(weights))
    assert run_validation(cp_settings, up.dispatcher.sent[-1]) == "ready"  # type: ignore[attr-defined]
    broken = _uploader(_broken(cp_settings), tenant_id)
    with pytest.raises(Unavailable):
        drafts_svc.upload_draft_adapter(
            broken, name, 1, draft_deployment, config, io.BytesIO(weights), len(weights)
        )
    with make_sessionmaker(cp_settings.database_url)() as s:
        statuses = s.scalars(
            select(DraftAdapter.status).where(DraftAdapter.adapter_version_id == version.id)
        ).all()
    assert statuses == ["deleting"]
    assert reconcile_objects(cp_settings).deleted_drafts
    with make_sessionmaker(cp_settings.database_url)() as s:
        assert (
            s.scalars(
                select(DraftAdapter.id).where(DraftAdapter.adapter_version_id == version.id)
            ).all()
            == []
        )


def test_a_draft_adapter_replaced_while_deleting_leaves_no_objects_behind(
    cp_settings: Any, base_model: str, tenant_id: uuid.UUID, adapter_r4: Path,
    draft_deployment: str,
) -> None:  # fmt: skip
    """Deleted while storage is down, then uploaded again for the same draft model before the
    reconciler ran: the new upload replaces the `deleting` row, and the old folder, now without
    a row, is collected as an orphan; the new draft adapter's objects stay."""
    name, _, old = _ready_version_and_draft(
        cp_settings, tenant_id, base_model, adapter_r4, draft_deployment
    )
    drafts_svc.delete_draft_adapter(_uploader(_broken(cp_settings), tenant_id), name, 1, old.id)
    up = _uploader(cp_settings, tenant_id)
    config, weights = adapter_files(adapter_r4)
    new = drafts_svc.upload_draft_adapter(
        up, name, 1, draft_deployment, config, io.BytesIO(weights), len(weights)
    )
    assert run_draft_validation(cp_settings, up.dispatcher.sent[-1]) == "ready"  # type: ignore[attr-defined]
    assert _draft(cp_settings, old.id) is None and _keys(cp_settings, old.object_prefix)

    report = reconcile_objects(cp_settings, grace_s=0)
    assert set(report.orphan_keys) == {old.config_key, old.weights_key}
    assert _keys(cp_settings, old.object_prefix) == []
    assert sorted(_keys(cp_settings, new.object_prefix)) == sorted(
        [new.config_key, new.weights_key]
    )
