"""The API's /metrics reports the adapter validation backlog (versions still `validating` and
how long the oldest has waited), read from the database, so the PrometheusRule's
`LoraplexValidationBacklog` alert reads a metric the code really exports."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update
from support.gateway_catalog import add_adapter_version

NAME = re.compile(r"\b(loraplex[:_][a-zA-Z0-9_:]+)")


def _samples(client) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[s.name] = s.value
    return out


def test_metrics_report_the_validation_backlog(
    client, cp_settings, make_tenant, base_model
) -> None:
    from loraplex.platform.db.models import AdapterVersion
    from loraplex.platform.db.session import make_sessionmaker, session_scope
    from loraplex.platform.services.validation_backlog import CACHE_S

    before = _samples(client)
    assert before["loraplex:adapter_validation_backlog"] == 0
    tenant_id, _ = make_tenant()
    sessions = make_sessionmaker(cp_settings.database_url)
    with session_scope(sessions) as s:
        _, old = add_adapter_version(s, uuid.UUID(tenant_id), base_model, "a", status="validating")
        add_adapter_version(s, uuid.UUID(tenant_id), base_model, "b", status="validating")
        add_adapter_version(s, uuid.UUID(tenant_id), base_model, "c", status="ready")
        ten_min_ago = datetime.now(UTC) - timedelta(minutes=10)
        s.execute(update(AdapterVersion).where(AdapterVersion.id == old.id)
                  .values(created_at=ten_min_ago))  # fmt: skip
    import time

    time.sleep(CACHE_S + 0.1)  # past the scrape cache
    after = _samples(client)
    assert after["loraplex:adapter_validation_backlog"] == 2
    assert 590 <= after["loraplex:adapter_validation_oldest_seconds"] <= 900


def test_the_backlog_alert_reads_what_the_api_exports(client) -> None:
    from support.infra import rendered, validate_resource

    exported = set(_samples(client))
    for env in ("dev", "prod"):
        [rule_doc] = [
            d for d in rendered()[f"{env}/platform.yaml"] if d["kind"] == "PrometheusRule"
        ]
        validate_resource(rule_doc)
        rules = {r["alert"]: r for g in rule_doc["spec"]["groups"] for r in g["rules"]}
        alert = rules["LoraplexValidationBacklog"]
        assert alert["labels"]["severity"] in ("page", "ticket") and alert["annotations"]["summary"]
        queried = set(NAME.findall(alert["expr"]))
        assert queried and queried <= exported, sorted(queried - exported)
