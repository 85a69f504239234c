"""A headless Chromium for the console's browser tests: Debian's `/usr/bin/chromium` driven by
Playwright, installed with apt when missing (as root), started with flags that keep it off the
network (every host but loopback resolves to nothing); axe-core (vendored) for accessibility.

Under CI (`LORAPLEX_REQUIRE_BROWSER=1`) a browser that cannot start fails the tests instead of
skipping them."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
AXE_JS = Path(__file__).parent / "vendor" / "axe-core-4.10.2" / "axe.min.js"
ARTIFACTS = Path(os.environ.get("LORAPLEX_ARTIFACTS", "tmp/artifacts"))
# Off the network: no DNS for anything but loopback, no background services, no proxy.
CHROMIUM_ARGS = [
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-extensions",
    "--disable-sync",
    "--no-pings",
    "--no-first-run",
    "--metrics-recording-only",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-sandbox",  # we run as root in CI containers
]


def _required() -> bool:
    return os.environ.get("LORAPLEX_REQUIRE_BROWSER") == "1"


def _unavailable(why: str) -> None:
    if _required():
        pytest.fail(f"the browser tests need Chromium (LORAPLEX_REQUIRE_BROWSER=1): {why}")
    pytest.skip(f"no browser: {why}")


def ensure_chromium() -> str:
    """The Chromium binary; installed with `apt-get install -y chromium` when missing and we
    are root. Raises RuntimeError saying why when there is none."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"{CHROMIUM} is missing and apt-get as root is not available")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"apt-get installed chromium but {CHROMIUM} is still missing")
    return CHROMIUM


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A launched headless Chromium (Playwright `Browser`), shared by one module. Not wider:
    Playwright's sync API keeps an event loop running in this thread until it stops, and
    every later `asyncio.run` in the session would fail."""
    try:
        path = ensure_chromium()
        from playwright.sync_api import sync_playwright
    except (RuntimeError, ImportError, subprocess.TimeoutExpired) as exc:
        _unavailable(str(exc))
        return
    pw = sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
    except Exception as exc:  # noqa: BLE001 - any launch failure is "no browser"
        pw.stop()
        _unavailable(f"Chromium did not start: {exc}")
        return
    try:
        yield browser
    finally:
        browser.close()
        pw.stop()


def new_page(browser: Any, base_url: str) -> Any:
    """A page in a fresh context (own cookies) that may reach only `base_url`'s origin;
    CSP is bypassed only so the tests can inject axe-core. Dialogs are recorded on
    `page.dialogs` (and dismissed)."""
    context = browser.new_context(base_url=base_url, bypass_csp=True)

    def only_local(route: Any) -> None:
        if route.request.url.startswith(base_url):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", only_local)
    page = context.new_page()
    page.dialogs = []  # type: ignore[attr-defined]

    def on_dialog(dialog: Any) -> None:
        page.dialogs.append(dialog.message)  # type: ignore[attr-defined]
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return page


def axe_violations(page: Any, impacts: tuple[str, ...] = ("serious", "critical")) -> list[dict]:
    """axe-core's violations of `impacts` on the current page (rule id, impact, targets)."""
    page.add_script_tag(content=AXE_JS.read_text(encoding="utf-8"))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "help": v["help"],
         "targets": [n["target"] for n in v["nodes"]][:5]}
        for v in result["violations"]
        if v.get("impact") in impacts
    ]  # fmt: skip


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot under the artifacts folder; returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
