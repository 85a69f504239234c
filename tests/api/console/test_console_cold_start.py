"""The deployments page (and the overview's replica table) shows each live replica of a
deployment with its cold-start timeline, read from a real engine replica's `/state` through
the API's own gateway (started by the app's lifespan)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.console import make_operator, sign_in
from support.gateway_stack import Replica, settings_env
from support.waiting import wait_until

from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment

pytestmark = pytest.mark.timeout(300)
PHASE_LABEL = r'<span class="phase-name">((\w+) [0-9.]+ s)</span>'


@pytest.fixture(scope="module")
def live_replica(
    console_settings: Any, base_model: str, tiny_llama: Path, redis_url: str, tmp_path_factory
):
    """A deployment of the tiny Llama with one real engine replica registered for it."""
    dep = f"cold-{uuid.uuid4().hex[:8]}"
    with session_scope(make_sessionmaker(console_settings.database_url)) as session:
        create_deployment(session, console_settings, DeploymentSpec(
            name=dep, base_model=base_model, weight_quantization="fp32", max_loras=2,
            max_lora_rank=8))  # fmt: skip
    work = tmp_path_factory.mktemp("cold-replica")
    env = settings_env(console_settings, "engine")
    replica = Replica(tiny_llama, dep, redis_url, work, ["--num-gpu-blocks", "16"], env=env)
    try:
        yield dep, replica
    finally:
        replica.stop()


def _phase_rows(html: str) -> dict[str, str]:
    """Each drawn phase's name -> its text label (name and seconds)."""
    return {name: label for label, name in re.findall(PHASE_LABEL, html)}


def test_deployments_page_shows_each_replicas_cold_start(
    console_app: Any, console_settings: Any, live_replica: tuple[str, Replica]
) -> None:
    dep, replica = live_replica
    state = replica.state()
    phases = state["cold_start"]
    assert phases and state["cold_start_seconds"] > 0  # the engine reports its own timeline
    make_operator(console_settings.database_url, "cold@example.com", "viewer")
    with TestClient(console_app, raise_server_exceptions=False) as client:  # lifespan: gateway
        assert sign_in(client, "cold@example.com").status_code == 303

        def page() -> str | None:
            r = client.get("/console/deployments")
            assert r.status_code == 200, r.text[:500]
            return r.text if 'class="phase-name"' in r.text else None

        html = wait_until(page, timeout=60, what="the replica's cold start on the page")
        section = html[html.index(f"<h4>{dep}</h4>") :]
        rows = _phase_rows(section)
        for p in phases:  # every phase labelled with its seconds, as the replica reported it
            assert rows[p["name"]] == f"{p['name']} {p['seconds']:.3f} s"
            assert f'title="{p["name"]}: {p["seconds"]:.3f} s' in section
        assert f"Cold start {state['cold_start_seconds']:.2f} s" in section
        widths = [float(w) for w in re.findall(r"width: ([0-9.]+)%", section)][: len(phases)]
        assert len(widths) == len(phases) and all(0 <= w <= 100 for w in widths)
        assert "<script" not in section.split("</table>")[0]  # plain HTML/CSS, no script

        overview = client.get("/console/partials/replicas").text
        assert "Cold start" in overview and _phase_rows(overview).keys() == rows.keys()


def test_a_replica_running_other_adapter_slots_than_its_row_is_flagged(
    console_app: Any, console_settings: Any, live_replica: tuple[str, Replica]
) -> None:
    """The fixture's replica was started by hand without the row's options (the launchers
    start theirs from the row): 256 slots against the row's 2. The page says they disagree
    instead of showing both figures as if they agreed."""
    from sqlalchemy import select

    from loraplex.platform.db.models import Deployment

    dep, replica = live_replica
    assert replica.state()["max_loras"] == 256
    with make_sessionmaker(console_settings.database_url)() as s:
        dep_id = s.scalars(select(Deployment.id).where(Deployment.name == dep)).one()
    make_operator(console_settings.database_url, "slots@example.com", "viewer")
    with TestClient(console_app, raise_server_exceptions=False) as client:
        assert sign_in(client, "slots@example.com").status_code == 303

        def table() -> str | None:
            html = client.get(f"/console/deployments/{dep_id}/replicas-now").text
            return html if "badge-healthy" in html else None

        html = wait_until(table, timeout=60, what="the replica on the deployment page")
    assert "0 / 256" in html
    assert "runs 256 adapter slots; the deployment asks for 2" in html
