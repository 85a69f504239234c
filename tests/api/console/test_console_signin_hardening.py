"""Console sign-in under hostile use (issue 22 items 5, 8, 9): password checks run off the
event loop; control characters in any console field are a clean 400 page; failures of one
account add a delay that grows (never a lock); addresses are limited by the client address that
trusted proxies name; the limits live in Redis, shared by every API process."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher
from fastapi.testclient import TestClient
from support.console import PASSWORD, csrf_of, make_operator, page_csrf, sign_in

FREE = 4  # failures allowed before the account's delay starts (this package's settings)


def _client(app: Any, address: str = "10.9.8.7") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://console.test")


async def _attempt(c: httpx.AsyncClient, email: str, password: str, **headers: str) -> Any:
    page = await c.get("/console/sign-in", headers=headers)
    assert page.status_code == 200, page.text
    return await c.post(
        "/console/sign-in",
        data={"email": email, "password": password, "csrf_token": csrf_of(page.text)},
        headers=headers,
    )


def test_password_checks_do_not_stall_the_event_loop(console_app: Any, console_settings) -> None:
    """Three wrong passwords at once: the loop keeps ticking (today each argon2 verification,
    ~0.3 s, ran on it)."""
    make_operator(console_settings.database_url, "stall@example.com", "viewer")
    hasher = PasswordHasher()
    digest = hasher.hash("something else entirely")
    began = time.perf_counter()
    with pytest.raises(Exception):  # noqa: B017 - argon2's mismatch error
        hasher.verify(digest, PASSWORD)
    verify_s = time.perf_counter() - began

    async def main() -> float:
        worst = 0.0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal worst
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                worst = max(worst, now - last)
                last = now

        tick = asyncio.create_task(ticker())
        async with _client(console_app, "10.77.0.1") as c:
            pages = [await c.get("/console/sign-in") for _ in range(3)]
            await asyncio.sleep(0.05)
            worst = 0.0
            answers = await asyncio.gather(*(
                c.post("/console/sign-in", data={"email": "stall@example.com",
                       "password": f"wrong password {i}", "csrf_token": csrf_of(p.text)})
                for i, p in enumerate(pages)
            ))  # fmt: skip
        done.set()
        await tick
        assert [a.status_code for a in answers] == [401, 401, 401]
        return worst

    stall = asyncio.run(main())
    assert stall < verify_s / 2, f"loop stalled {stall:.3f}s (one verification {verify_s:.3f}s)"


@pytest.fixture(scope="module")
def signed(console_app: Any, console_settings: Any):
    """An owner's client, signed in once for the module."""
    make_operator(console_settings.database_url, "nul-owner@example.com", "owner")
    c = TestClient(console_app, raise_server_exceptions=False)
    assert sign_in(c, "nul-owner@example.com").status_code == 303
    c.csrf = page_csrf(c)  # type: ignore[attr-defined]
    yield c
    c.close()


@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("post", "/console/sign-in", {"email": "a\x00b@example.com", "password": "x" * 12}),
        ("post", "/console/sign-in", {"email": "a\x01b@example.com", "password": "x" * 12}),
        ("post", "/console/first-owner", {"admin_key": "k\x00", "email": "o@example.com"}),
        ("get", "/console/tenants?q=a%00b", None),
        ("get", "/console/audit?actor=%00", None),
        ("get", "/console/adapters?tenant=x%00", None),
        ("get", "/console/tenants/%00", None),
        ("post", "/console/tenants", {"name": "evil\x00name"}),
        ("post", "/console/tenants", {"name": "bell\x07"}),
    ],
)
def test_control_characters_are_a_clean_400_page(
    signed: TestClient, console_app: Any, method: str, path: str, data: dict | None
) -> None:
    c = signed
    if path.startswith(("/console/sign-in", "/console/first-owner")):
        c = TestClient(console_app, raise_server_exceptions=False)
        token = csrf_of(c.get("/console/sign-in").text)
    else:
        token = signed.csrf  # type: ignore[attr-defined]
    if method == "post":
        r = c.post(path, data={**(data or {}), "csrf_token": token}, follow_redirects=False)
    else:
        r = c.get(path, follow_redirects=False)
    assert r.status_code in (400, 422), (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("text/html")
    assert "control character" in r.text


def test_an_accounts_delay_grows_and_never_locks(console_app: Any, console_settings) -> None:
    """Past the free failures each one doubles the account's wait (1 s, 2 s, ...); once the
    wait is over, the right password signs in: an attacker cannot lock the owner out."""
    make_operator(console_settings.database_url, "delay@example.com", "owner")

    async def main() -> None:
        async with _client(console_app, "10.60.0.1") as c:
            for _ in range(FREE):
                assert (
                    await _attempt(c, "delay@example.com", "wrong password!!")
                ).status_code == 401
            early = await _attempt(c, "delay@example.com", PASSWORD)
            assert early.status_code == 429 and early.headers["retry-after"] == "1"
            await asyncio.sleep(1.1)
            assert (await _attempt(c, "delay@example.com", "wrong password!!")).status_code == 401
            early = await _attempt(c, "delay@example.com", PASSWORD)
            assert early.status_code == 429 and early.headers["retry-after"] == "2"
            await asyncio.sleep(2.1)
            assert (await _attempt(c, "delay@example.com", PASSWORD)).status_code == 303

    asyncio.run(main())


def _address_app(console_settings: Any) -> Any:
    from loraplex.api.app import create_app

    return create_app(console_settings.model_copy(update={
        "console_trusted_proxies": ["10.0.0.0/8"], "console_signin_address_failures": 3,
    }))  # fmt: skip


def test_addresses_are_limited_by_what_trusted_proxies_name(console_settings) -> None:
    app = _address_app(console_settings)

    async def fail(c: httpx.AsyncClient, **headers: str) -> int:
        email = f"nobody-{uuid.uuid4().hex[:8]}@example.com"  # no account delay involved
        return (await _attempt(c, email, "wrong password!!", **headers)).status_code

    async def main() -> None:
        async with _client(app, "10.1.2.3") as proxy:
            a = {"x-forwarded-for": "198.51.100.7, 10.4.4.4"}
            assert [await fail(proxy, **a) for _ in range(3)] == [401, 401, 401]
            assert await fail(proxy, **a) == 429  # that client, named by the proxy
            assert await fail(proxy, **{"x-forwarded-for": "198.51.100.8"}) == 401  # another
        async with _client(app, "192.0.2.50") as direct:  # not a trusted proxy: header ignored
            spoofed = [
                await fail(direct, **{"x-forwarded-for": f"203.0.113.{i}"}) for i in range(4)
            ]
            assert spoofed == [401, 401, 401, 429]

    asyncio.run(main())


def test_limits_are_shared_by_every_api_process(console_settings) -> None:
    """Two apps (as two API processes) over the same Redis: failures counted by one are
    counted by the other."""
    make_operator(console_settings.database_url, "shared@example.com", "owner")
    from loraplex.api.app import create_app

    one, two = create_app(console_settings), create_app(console_settings)

    async def main() -> None:
        async with _client(one, "10.61.0.1") as a, _client(two, "10.61.0.2") as b:
            for i in range(FREE):
                c = a if i % 2 == 0 else b
                assert (
                    await _attempt(c, "shared@example.com", "wrong password!!")
                ).status_code == 401
            assert (await _attempt(b, "shared@example.com", PASSWORD)).status_code == 429
            assert (await _attempt(a, "shared@example.com", PASSWORD)).status_code == 429

    asyncio.run(main())


def test_a_refused_sign_in_is_answered_after_a_pause(console_settings) -> None:
    """A refused attempt (the address or the account over its limit) gets its 429 after the
    pause refused tenants get (`rate_limited_delay_s`): a flood from one address then waits
    instead of costing the API a request's CPU at the rate it can send."""
    app = _address_app(console_settings)  # 3 failures an address

    async def main() -> tuple[float, float]:
        async with _client(app, "192.0.2.77") as c:
            for _ in range(3):
                started = time.perf_counter()
                assert (
                    await _attempt(c, "nobody@example.com", "wrong password!!")
                ).status_code == 401
            failed_s = time.perf_counter() - started
            started = time.perf_counter()
            refused = await _attempt(c, "nobody@example.com", "wrong password!!")
            assert refused.status_code == 429
            return failed_s, time.perf_counter() - started

    failed_s, refused_s = asyncio.run(main())
    pause = console_settings.rate_limited_delay_s
    assert pause > 0 and refused_s >= 0.8 * pause, (failed_s, refused_s)
