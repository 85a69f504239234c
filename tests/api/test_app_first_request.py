"""The first request a fresh API process answers holds its event loop no longer than any
other: FastAPI builds each route's matching state lazily, on the first request that walks
past it (~90 ms of CPU for our route table), so the app builds it while it is being made."""

from __future__ import annotations

import asyncio

import httpx

from loraplex.api.app import create_app
from loraplex.platform.loop_watch import collect
from loraplex.platform.settings import Settings

STALL_MS = 20.0


def test_first_request_to_a_fresh_app_does_not_hold_the_loop() -> None:
    stalls, stop = collect(STALL_MS)
    try:  # making the app (its route walk included) runs nothing on any event loop
        app = create_app(Settings(database_url=None, broker_url=None))
    finally:
        stop()
    assert not stalls, [f"{s.cpu_ms} ms in {s.callback}" for s in stalls]

    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")

    async def first_requests() -> list[int]:
        async with client:
            return [(await client.get(path)).status_code for path in ("/nope", "/v1/models")]

    stalls, stop = collect(STALL_MS)
    try:
        statuses = asyncio.run(first_requests())
    finally:
        stop()
    assert statuses[0] == 404
    assert not stalls, [f"{s.cpu_ms} ms in {s.callback}" for s in stalls]
