"""The console in a real browser (headless Chromium through Playwright) against a running
stack started the way `loraplex up` starts it: the API process (console included), an engine
replica serving the demo model, a Celery worker, over real PostgreSQL, S3 and Redis.

Each page is screenshotted (artifacts) and checked with axe-core (no serious or critical
violation)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import func, select
from support.browser import axe_violations, chromium, new_page, screenshot
from support.console import PASSWORD, make_operator
from support.control_plane import drop_database, fresh_database
from support.gateway_stack import Api, Replica, settings_env
from support.opcli import OperatorShell
from support.peft_adapters import make_peft_adapter
from support.waiting import wait_until

from loraplex.platform.db.models import Tenant
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine_spec import engine_args_for_deployment
from loraplex.platform.local_processes import start_worker_process
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.services.operators import invite_operator

__all__ = ["chromium"]
pytestmark = pytest.mark.timeout(600)
XSS = "<img src=x onerror=alert(1)>"
OWNER, VIEWER = "owner@console.test", "viewer@console.test"


@pytest.fixture(autouse=True)
def event_loop_never_blocked() -> Iterator[None]:
    """The API runs in its own process here (its loop is not in this one); the only loop in
    this process is Playwright's, which the package-wide stall watch must not judge."""
    yield


class Stack:
    """What the browser tests reach: the API URL, the DB, and a worker started on demand."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)
        self.worker = None

    def start_worker(self) -> None:
        if self.worker is None:
            self.worker = start_worker_process(
                settings_env(self.settings, "worker"), self.work / "worker.log"
            )

    def tenants(self) -> int:
        with self.factory() as s:
            return int(s.scalar(select(func.count()).select_from(Tenant)) or 0)

    def openai(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.api.url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def stack(pg_url: str, settings: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("console-stack")
    db_url = fresh_database(pg_url, "console")
    tag = uuid.uuid4().hex[:8]
    s = settings.model_copy(
        update={
            "database_url": db_url,
            "data_dir": work / "data",
            "celery_queue": f"lp-console-{tag}",
            "rate_limit_rpm": 100_000,
            "usage_flush_interval_s": 0.2,
        }
    )
    model_dir = make_demo_model(work / "demo")
    base, dep = f"demo-{tag}", f"demo-dep-{tag}"
    register_base_model(s, base, model_dir)
    factory = make_sessionmaker(db_url)
    with session_scope(factory) as session:
        row = create_deployment(session, s, DeploymentSpec(name=dep, base_model=base,
                                weight_quantization="fp32", max_loras=4, max_lora_rank=16))  # fmt: skip
        # The replica runs the row's options, as the launchers start it (the one mapping).
        options = engine_args_for_deployment(row, model=str(model_dir))
    make_operator(db_url, OWNER, "owner")
    make_operator(db_url, VIEWER, "viewer")
    replica = Replica(model_dir, dep, redis_url, work, options, env=settings_env(s, "engine"))
    api = Api(settings_env(s), work)
    st = Stack(api=api, replica=replica, settings=s, factory=factory, model_dir=model_dir,
               base=base, work=work, state={})  # fmt: skip
    try:
        yield st
    finally:
        if st.worker is not None:
            st.worker.stop()
        api.stop()
        replica.stop()
        drop_database(pg_url, db_url)


def _sign_in(page: Any, email: str) -> None:
    page.goto("/console/sign-in")
    page.get_by_label("Email", exact=True).fill(email)
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/console/")


@pytest.fixture(scope="module")
def owner_page(stack: Stack, chromium: Any):
    page = new_page(chromium, stack.api.url)
    _sign_in(page, OWNER)
    yield page
    page.context.close()


def _create_tenant(page: Any, name: str) -> str:
    page.goto("/console/tenants")
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_role("button", name="Create tenant").click()
    page.wait_for_url("**/console/tenants/*")
    return page.url.split("/console/tenants/")[1].split("?")[0]


def _issue_key(page: Any) -> str:
    page.get_by_role("button", name="Issue key").click()
    return page.locator("#new-key-secret").inner_text().strip()


def test_sign_in_create_tenant_and_see_key_once(stack: Stack, owner_page: Any) -> None:
    name = f"acme-{uuid.uuid4().hex[:6]}"
    tid = _create_tenant(owner_page, name)
    assert owner_page.get_by_role("heading", level=1).inner_text() == f"Tenant {name}"
    key = _issue_key(owner_page)
    assert key.startswith("lp_")
    owner_page.goto(f"/console/tenants/{tid}")
    assert key not in owner_page.content()  # shown once only
    assert owner_page.locator("#new-key-secret").count() == 0
    stack.state.update(tenant_id=tid, key=key, tenant=name)


def test_adapter_goes_validating_to_ready_without_reload(stack: Stack, owner_page: Any) -> None:
    """Pushed with the operator CLI while no worker runs; the page shows it validating, then
    (a worker started) ready, by htmx polling in the same document."""
    key, tid = stack.state["key"], stack.state["tenant_id"]
    folder = make_peft_adapter(stack.model_dir, stack.work / "adapter", seed=1, rank=4)
    shell = OperatorShell(stack.api.url, stack.settings.admin_key, api_key=key)
    shell.ok("adapters", "push", str(folder), "--name", "support-bot",
             "--base-model", stack.base, "--no-wait")  # fmt: skip
    owner_page.goto(f"/console/tenants/{tid}")
    status = owner_page.locator('[data-adapter="support-bot"]')
    assert status.inner_text() == "validating"  # no worker runs yet
    owner_page.evaluate("window.__sameDocument = 'yes'")
    stack.start_worker()
    status.filter(has_text="ready").wait_for(timeout=90_000)
    assert owner_page.evaluate("window.__sameDocument") == "yes"  # htmx swapped, no reload
    stack.state["adapter"] = "support-bot"


def _chart_requests(page: Any) -> float:
    return page.evaluate(
        "() => window.lpCharts && window.lpCharts.rps ? "
        "window.lpCharts.rps.data[1].reduce((a, b) => a + (b || 0), 0) * 60 : -1"
    )


def test_overview_chart_gains_points_from_sdk_requests(stack: Stack, owner_page: Any) -> None:
    owner_page.goto("/console/")
    wait_until(lambda: _chart_requests(owner_page) >= 0, timeout=30, what="the charts to draw")
    before = _chart_requests(owner_page)
    client = stack.openai(stack.state["key"])
    for model in (stack.base, stack.state.get("adapter", stack.base), stack.base):
        out = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        assert out.usage.completion_tokens > 0
    wait_until(lambda: _chart_requests(owner_page) >= before + 2.9 or None, timeout=60,
               interval=0.5, what="the chart to show the new requests")  # fmt: skip
    ttft = owner_page.evaluate("window.lpCharts.ttft.data[1].filter(v => v != null).length")
    assert ttft >= 1
    assert "healthy" in owner_page.locator("#replicas").inner_text()


def test_revoked_key_is_refused(stack: Stack, owner_page: Any) -> None:
    tid, key = stack.state["tenant_id"], stack.state["key"]
    owner_page.goto(f"/console/tenants/{tid}")
    owner_page.get_by_role("button", name="Revoke key").first.click()
    owner_page.wait_for_url(re.compile("msg=Key"))
    with pytest.raises(openai.AuthenticationError):
        stack.openai(key).models.list()


def test_suspended_tenant_keys_are_all_refused(stack: Stack, owner_page: Any) -> None:
    tid = _create_tenant(owner_page, f"globex-{uuid.uuid4().hex[:6]}")
    keys = [_issue_key(owner_page) for _ in range(2)]
    for k in keys:
        assert stack.openai(k).models.list() is not None
    owner_page.get_by_role("button", name="Suspend tenant").click()
    owner_page.wait_for_url(re.compile("msg=Suspended"))
    for k in keys:
        with pytest.raises(openai.PermissionDeniedError) as err:
            stack.openai(k).models.list()
        assert err.value.code == "tenant_suspended"
    assert tid


def test_viewer_cannot_change_anything(stack: Stack, chromium: Any) -> None:
    page = new_page(chromium, stack.api.url)
    try:
        _sign_in(page, VIEWER)
        page.goto("/console/tenants")
        assert page.get_by_role("button", name="Create tenant").count() == 0
        before = stack.tenants()
        status = page.evaluate(
            """async () => {
                const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token'];
                const body = new URLSearchParams({name: 'viewer-was-here', csrf_token: token});
                return (await fetch('/console/tenants', {method: 'POST', body})).status;
            }"""
        )
        assert status == 403 and stack.tenants() == before
    finally:
        page.context.close()


def test_post_without_csrf_is_refused(stack: Stack, owner_page: Any) -> None:
    owner_page.goto("/console/tenants")
    before = stack.tenants()
    status = owner_page.evaluate(
        """async () => (await fetch('/console/tenants', {method: 'POST',
              body: new URLSearchParams({name: 'no-token'})})).status"""
    )
    assert status == 403 and stack.tenants() == before


def test_tenant_name_with_markup_shows_as_text(stack: Stack, owner_page: Any) -> None:
    _create_tenant(owner_page, XSS)
    assert owner_page.get_by_role("heading", level=1).inner_text() == f"Tenant {XSS}"
    owner_page.goto("/console/tenants")
    assert owner_page.get_by_role("link", name=XSS).count() == 1
    assert owner_page.locator("main img").count() == 0
    owner_page.goto("/console/audit")
    time.sleep(0.5)
    assert owner_page.dialogs == []


LOAD_SAMPLES = "window.lpCharts.load ? window.lpCharts.load.data[0].length : 0"
PAGES = {
    "overview": "/console/",
    "tenants": "/console/tenants",
    "adapters": "/console/adapters",
    "deployments": "/console/deployments",
    "jobs": "/console/jobs",
    "audit": "/console/audit",
    "operators": "/console/operators",
    "request-lookup": "/console/requests",
}


def _ids(stack: Stack) -> dict[str, str]:
    from loraplex.platform.db.models import Adapter, Deployment

    with stack.factory() as s:
        adapter = s.scalars(select(Adapter.id).where(Adapter.name == "support-bot")).first()
        dep = s.scalars(select(Deployment.id).order_by(Deployment.created_at)).first()
    return {"adapter": str(adapter), "deployment": str(dep)}


def _failed_responses(page: Any) -> list[str]:
    """Record every answer >= 400 the page gets from now on (e.g. a missing favicon)."""
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return failed


def test_charts_draw_lines_with_units_over_their_window(stack: Stack, owner_page: Any) -> None:
    """Latency lines join over minutes without requests, the error rate is in %, the tenant's
    30-day chart spans its 30 days, and no page asks for a file that is not there."""
    failed = _failed_responses(owner_page)
    owner_page.goto("/console/")
    wait_until(lambda: _chart_requests(owner_page) >= 0, timeout=30, what="the charts to draw")
    assert owner_page.evaluate("window.lpCharts.ttft.series[1].spanGaps") is True
    assert owner_page.evaluate("window.lpCharts.error_pct.axes[1].label") == "%"
    high = owner_page.evaluate("window.lpCharts.error_pct.scales.y.max")
    assert 1 <= high <= 100
    owner_page.goto(f"/console/tenants/{stack.state['tenant_id']}")
    doc = owner_page.evaluate("JSON.parse(document.querySelector('[data-usage]').dataset.usage)")
    x = owner_page.evaluate(
        "[window.lpCharts.usage.scales.x.min, window.lpCharts.usage.scales.x.max]"
    )
    assert x == doc["x_range"] and len(doc["t"]) == 30
    owner_page.goto(f"/console/deployments/{_ids(stack)['deployment']}")  # load over time
    wait_until(lambda: owner_page.evaluate(LOAD_SAMPLES) >= 2, timeout=40,
               what="two samples of the deployment's load, kept by the API")  # fmt: skip
    assert owner_page.evaluate("window.lpCharts.load.data[4].slice(-1)[0]") >= 1  # resident
    low, high = owner_page.evaluate(
        "[window.lpCharts.load.scales.x.min, window.lpCharts.load.scales.x.max]"
    )
    oldest, newest = owner_page.evaluate(
        "[window.lpCharts.load.data[0][0], window.lpCharts.load.data[0].slice(-1)[0]]"
    )
    assert (low, high) == (min(oldest, newest - 60), newest)  # the history, not a padded guess
    time.sleep(0.5)
    assert failed == []


def test_every_page_screenshot_and_accessibility(stack: Stack, owner_page: Any) -> None:
    ids = _ids(stack)
    pages = {
        **PAGES,
        "tenant": f"/console/tenants/{stack.state['tenant_id']}",
        "adapter": f"/console/adapters/{ids['adapter']}",
        "deployment": f"/console/deployments/{ids['deployment']}",
    }
    found = {}
    failed = _failed_responses(owner_page)
    for name, path in pages.items():
        owner_page.goto(path)
        if name == "request-lookup":  # a refused request, looked up by its id
            bad = stack.openai("lp_not_a_key")
            with pytest.raises(openai.AuthenticationError) as err:
                bad.models.list()
            rid = err.value.response.headers["x-request-id"]
            lookup = f"/console/requests?id={rid}"
            wait_until(lambda u=lookup: owner_page.goto(u).status == 200,
                       timeout=20, what="the refused request in the log")  # fmt: skip
        if name == "deployment":  # its load chart, two samples in
            wait_until(lambda: owner_page.evaluate(LOAD_SAMPLES) >= 2, timeout=40,
                       what="load samples")  # fmt: skip
            assert "/ 4" in owner_page.content() and "mismatch" not in owner_page.content()
        if name == "overview":
            wait_until(lambda: _chart_requests(owner_page) >= 0, timeout=30, what="charts")
        if name == "tenant":  # its usage chart counts the SDK requests made with its key
            total = owner_page.evaluate(
                "window.lpCharts.usage.data.slice(1).flat().reduce((a, b) => a + b, 0)"
            )
            assert total >= 3
        shot = screenshot(owner_page, name)
        assert shot.stat().st_size > 1000
        found[name] = axe_violations(owner_page)
    sign_in = new_page(owner_page.context.browser, stack.api.url)
    sign_in.goto("/console/sign-in")
    screenshot(sign_in, "sign-in")
    found["sign-in"] = axe_violations(sign_in)
    with session_scope(stack.factory) as session:  # an invitation's one-time link
        _, token = invite_operator(session, "invitee@example.com", "viewer", actor="test")
    assert sign_in.goto(f"/console/set-password/{token}").status == 200
    screenshot(sign_in, "set-password")
    found["set-password"] = axe_violations(sign_in)
    sign_in.context.close()
    missing = f"/console/adapters/{uuid.uuid4()}"
    assert owner_page.goto(missing).status == 404  # an error page
    screenshot(owner_page, "error")
    found["error"] = axe_violations(owner_page)
    dark = owner_page.context.browser.new_context(
        base_url=stack.api.url, color_scheme="dark", bypass_csp=True
    )
    try:  # the dark theme (the system setting) passes the same checks
        page = dark.new_page()
        _sign_in(page, OWNER)
        page.goto(f"/console/tenants/{stack.state['tenant_id']}")
        screenshot(page, "tenant-dark")
        assert page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches") is True
        found["tenant-dark"] = axe_violations(page)
    finally:
        dark.close()
    assert {k: v for k, v in found.items() if v} == {}
    expected = ("/console/requests?id=", missing)  # the lookup's wait, the error page
    assert [f for f in failed if not any(e in f for e in expected)] == []
    assert Path(screenshot(owner_page, "last")).exists()


def test_the_accessibility_check_can_fail(chromium: Any) -> None:
    """axe-core as wired here does report serious problems (an unlabeled input, an image
    without alt text), so the clean pages above mean something."""
    page = new_page(chromium, "http://127.0.0.1:9")
    try:
        page.set_content(
            "<html><head><title>bad</title></head><body><main><h1>x</h1>"
            '<input type="text"><img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">'
            "</main></body></html>"
        )
        ids = {v["id"] for v in axe_violations(page)}
        assert {"label", "image-alt"} <= ids
    finally:
        page.context.close()
