"""Calling a replica directly in tests, in the wire format: the headers it requires (the
replica secret the test session shares, the wire version) and a blocking `/generate` that
returns the whole stream."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

from loraplex.platform.wire import (
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    DeltaEvent,
    FinishEvent,
    decode_event,
)
from loraplex.platform.wire.auth import bearer

SECRET = os.environ["LORAPLEX_REPLICA_SECRET"]  # set by tests/conftest.py
HEADERS = {WIRE_VERSION_HEADER: str(WIRE_VERSION), "authorization": bearer(SECRET)}


def body(ids: list[int], rid: str = "r", **sampling: Any) -> dict[str, Any]:
    """A `/generate` body (sampling fields by keyword)."""
    return {"request_id": rid, "prompt_token_ids": ids, "sampling": sampling}


@dataclass
class Generated:
    """A finished stream: its events, and the tokens and text they carried."""

    events: list[DeltaEvent | FinishEvent]

    @property
    def token_ids(self) -> list[int]:
        return [t for e in self.events if isinstance(e, DeltaEvent) for t in e.token_ids]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, DeltaEvent))

    @property
    def finish(self) -> FinishEvent:
        last = self.events[-1]
        assert isinstance(last, FinishEvent), last
        return last


def generate(url: str, req: dict[str, Any], timeout: float = 60) -> Generated:
    """POST /generate and read the stream to its end (asserts a 200 in the wire version)."""
    with httpx.stream("POST", url + "/generate", json=req, headers=HEADERS, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers[WIRE_VERSION_HEADER] == str(WIRE_VERSION)
        return Generated([decode_event(line[6:]) for line in r.iter_lines() if line])
