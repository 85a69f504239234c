"""The gateway's text-work pool (parsing, templating, tokenizing) serves tenants in turn: one
tenant's queue of long prompts does not hold another tenant's request behind it, nor fill the
queue so that the other gets 503s."""

from __future__ import annotations

import asyncio
import time

import pytest

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.text_work import TextWorkers


def _job(name: str, done: list[str]) -> str:
    time.sleep(0.01)
    done.append(name)
    return name


def test_a_lone_request_is_not_queued_behind_a_flood() -> None:
    async def body() -> list[str]:
        pool = TextWorkers(workers=1, queue_limit=64)
        done: list[str] = []
        flood = [
            asyncio.create_task(pool.run_for("attacker", _job, f"a{i}", done)) for i in range(12)
        ]  # fmt: skip (12: within its share of the waiting room)
        await asyncio.sleep(0)  # the flood is queued first
        mine = asyncio.create_task(pool.run_for("bystander", _job, "b", done))
        await asyncio.gather(*flood, mine)
        pool.close()
        return done

    done = asyncio.run(body())
    assert done.index("b") <= 2, done


def test_one_tenant_cannot_fill_the_queue_for_everyone() -> None:
    async def body() -> tuple[int, str]:
        pool = TextWorkers(workers=1, queue_limit=16)
        done: list[str] = []
        tasks = [asyncio.create_task(pool.run_for("attacker", _job, f"a{i}", done))
                 for i in range(40)]  # fmt: skip
        await asyncio.sleep(0)
        refused = 0
        for t in tasks:
            try:
                await t
            except HttpError as exc:
                assert exc.status == 503
                refused += 1
        ok = await pool.run_for("bystander", _job, "b", done)
        pool.close()
        return refused, ok

    refused, ok = asyncio.run(body())
    assert refused > 0 and ok == "b"


def test_the_bystander_is_admitted_while_the_attacker_is_at_its_limit() -> None:
    async def body() -> str:
        pool = TextWorkers(workers=1, queue_limit=16)
        done: list[str] = []
        flood = [asyncio.create_task(pool.run_for("attacker", _job, f"a{i}", done))
                 for i in range(40)]  # fmt: skip
        await asyncio.sleep(0)
        mine = await pool.run_for("bystander", _job, "b", done)  # not a 503
        await asyncio.gather(*flood, return_exceptions=True)
        pool.close()
        return mine

    assert asyncio.run(body()) == "b"


@pytest.mark.parametrize("tenant", [None, "t"])
def test_run_still_runs_plain_jobs(tenant: str | None) -> None:
    async def body() -> str:
        pool = TextWorkers(workers=2)
        out = await (
            pool.run(_job, "x", []) if tenant is None else pool.run_for(tenant, _job, "x", [])
        )
        pool.close()
        return out

    assert asyncio.run(body()) == "x"


def test_one_tenant_alone_may_fill_the_whole_room() -> None:
    """Work-conserving: with nobody else waiting, a single tenant's burst uses every place
    (the load bench's 120 streams of one tenant must not be refused)."""

    async def body() -> tuple[int, int]:
        pool = TextWorkers(workers=1, queue_limit=16)
        done: list[str] = []
        tasks = [asyncio.create_task(pool.run_for("solo", _job, f"s{i}", done)) for i in range(17)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        pending = pool.pending
        pool.close()
        return sum(isinstance(r, HttpError) for r in results), pending

    refused, pending = asyncio.run(body())
    assert refused == 0 and pending == 0
