"""Each deployment's load over time, kept by the API: every `SAMPLE_EVERY_S` it reads the
`/state` of every live replica of every deployment (through its gateway, as the pages do) and
keeps the last `KEEP` samples per deployment in memory (6 hours at 10 s, about 200 KB a
deployment; deployments that are gone are dropped). Each API process keeps its own, from its
start; the deployment page charts it (`/console/api/deployments/{id}/load`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import astuple, dataclass, fields
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from loraplex.platform.db.session import session_scope
from loraplex.platform.services import console_queries as cq

from .replicas import views_of

log = logging.getLogger("loraplex.console.load")

SAMPLE_EVERY_S = 10.0
KEEP = 2160  # samples per deployment: 6 hours at 10 s
UNITS = {"kv_pct": "%", "waiting": "requests", "running": "requests", "resident": "adapters",
         "replicas": "replicas"}  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """A deployment's load at one moment: live replicas that answered, KV use of the busiest
    (%), and queued requests, running requests and resident adapters summed over them."""

    t: int
    replicas: int
    kv_pct: float
    waiting: int
    running: int
    resident: int


_KEYS = [f.name for f in fields(Sample)]


class LoadHistory:
    """The last `keep` samples of each deployment (bounded: old samples fall off)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._by_deployment: dict[str, deque[Sample]] = {}

    def add(self, deployment: str, sample: Sample) -> None:
        """Append a sample of `deployment`."""
        self._by_deployment.setdefault(deployment, deque(maxlen=self.keep)).append(sample)

    def keep_only(self, deployments: set[str]) -> None:
        """Forget deployments that no longer exist."""
        for name in set(self._by_deployment) - deployments:
            del self._by_deployment[name]

    def series(self, deployment: str) -> dict[str, list[Any]]:
        """The history as columns (`t` in unix seconds), oldest first."""
        rows = [astuple(s) for s in self._by_deployment.get(deployment, ())]
        return {key: [r[i] for r in rows] for i, key in enumerate(_KEYS)}


async def sample_once(app: FastAPI, history: LoadHistory) -> None:
    """One sample of every deployment's live replicas (nothing without a gateway or database)."""
    gw = getattr(app.state, "gateway", None)
    sessions = getattr(app.state, "sessions", None)
    if gw is None or sessions is None:
        return

    def names() -> set[str]:
        with session_scope(sessions) as session:
            return {d.name for d in cq.deployments_with_models(session)[0]}

    deployments = await run_in_threadpool(names)
    history.keep_only(deployments)
    now = int(time.time())
    for name in sorted(deployments):
        states = [v.state for v in await views_of(gw, name) if v.state is not None]
        history.add(
            name,
            Sample(
                t=now,
                replicas=len(states),
                kv_pct=round(100 * max((s.kv_cache_usage for s in states), default=0.0), 2),
                waiting=sum(s.num_requests_waiting for s in states),
                running=sum(s.num_requests_running for s in states),
                resident=sum(len(s.resident_adapters) for s in states),
            ),
        )


STOP_WAIT_S = 5.0


async def _sample_forever(app: FastAPI, history: LoadHistory) -> None:
    while True:
        try:
            await sample_once(app, history)
        except Exception:  # noqa: BLE001 - a missed sample must not stop the history
            log.exception("console: load sample failed")
        await asyncio.sleep(SAMPLE_EVERY_S)


@contextlib.asynccontextmanager
async def sampling(app: FastAPI) -> AsyncIterator[None]:
    """The console router's lifespan: sample in the background while the app runs."""
    history = LoadHistory()
    app.state.load_history = history
    task = asyncio.get_running_loop().create_task(_sample_forever(app, history))
    try:
        yield
    finally:
        task.cancel()
        # Bounded: a sample stuck in a database call must not hold the app's shutdown.
        await asyncio.wait({task}, timeout=STOP_WAIT_S)
