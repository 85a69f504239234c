"""The request log: tenant requests the API refused or failed (status >= 400, or an error
event inside a stream that had answered 200), written in batches off the event loop, kept for
a retention period, found again by request id.

The console's charts count the refusals as requests and errors (requests that fail after
admission are usage rows with `failed`); its request lookup shows an entry with the detail the
tenant was not shown and where the gateway sent it. The gateway tells the log where it sent a
request through `note_route` / `note_stream_error`: they fill the `Route` the API's middleware
made current for that request (a context variable; the request's tasks share it)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import ApiKey, RequestLog, Tenant
from loraplex.platform.errors import LoraplexError

log = logging.getLogger("loraplex.request_log")

MAX_PENDING = 10_000  # entries held in memory between flushes (the oldest go past that)
BATCH = 1_000
PURGE_EVERY_S = 600.0
_TEXT_CAP = 2_000


@dataclass(frozen=True)
class Entry:
    """One refused or failed request, as the API saw it."""

    request_id: str
    created_at: datetime
    method: str
    path: str
    status: int
    latency_ms: int
    code: str | None = None
    message: str | None = None
    detail: str | None = None
    key_hash: str | None = None  # sha256 of the bearer token: tenant and key found at flush
    route: Route | None = None  # where the gateway sent it (None: it never got that far)
    in_stream: bool = False  # an error event after the stream had answered 200


class Resolved(Protocol):
    """What the log reads of the gateway's resolved model (`gateway.resolve.ResolvedModel`)."""

    @property
    def deployment_name(self) -> str: ...
    @property
    def adapter_id(self) -> uuid.UUID | None: ...
    @property
    def adapter_name(self) -> str | None: ...
    @property
    def adapter_version(self) -> int | None: ...


class Tried(Protocol):
    """What the log reads of a replica the gateway sent the request to (`ReplicaInfo`)."""

    @property
    def replica_id(self) -> str: ...
    @property
    def deployment(self) -> str: ...


@dataclass
class Route:
    """Where the gateway sent one request: its deployment, the adapter version asked for, the
    replicas tried (in order), and the detail of an error sent inside its stream."""

    deployment: str | None = None
    adapter_id: uuid.UUID | None = None
    adapter: str | None = None
    adapter_version: int | None = None
    replicas: list[str] = field(default_factory=list)
    stream_detail: str | None = None


_ROUTE: ContextVar[Route | None] = ContextVar("loraplex_request_route", default=None)


def open_route() -> tuple[Route, Token[Route | None]]:
    """Make a fresh `Route` current for the request being served (the API's middleware)."""
    route = Route()
    return route, _ROUTE.set(route)


def close_route(token: Token[Route | None]) -> None:
    """Undo `open_route` once the request is answered."""
    _ROUTE.reset(token)


def note_route(resolved: Resolved, replicas: Sequence[Tried]) -> None:
    """The gateway routed the current request: its resolved model and the replicas tried, in
    order (the last one's deployment is the one that served it)."""
    route = _ROUTE.get()
    if route is None:
        return
    route.deployment = replicas[-1].deployment if replicas else resolved.deployment_name
    route.adapter_id, route.adapter = resolved.adapter_id, resolved.adapter_name
    route.adapter_version = resolved.adapter_version
    route.replicas += [r.replica_id for r in replicas if r.replica_id not in route.replicas]


def note_stream_error(exc: BaseException) -> None:
    """The current request's stream ends with an error event for `exc`: keep what the tenant
    is not shown (the error's detail, or the exception itself)."""
    route = _ROUTE.get()
    if route is None:
        return
    if isinstance(exc, LoraplexError):
        route.stream_detail = str(exc.detail) if exc.detail else exc.message
    else:
        route.stream_detail = f"{type(exc).__name__}: {exc}"


def _text(text: str | None, cap: int = _TEXT_CAP) -> str | None:
    """A column's text: at most `cap` characters, NUL (a client can put one in a path or a
    name, and PostgreSQL text refuses it, failing the whole batch) shown as U+FFFD."""
    return None if text is None else text[:cap].replace("\x00", "\ufffd")


class RequestLogWriter:
    """Holds entries in memory and writes them in batches (call `flush` off the event loop;
    one flush at a time). Entries past MAX_PENDING are dropped oldest first and counted in the
    log, never silently."""

    def __init__(self, sessions: sessionmaker[Session], retention: timedelta) -> None:
        self.sessions = sessions
        self.retention = retention
        self._pending: deque[Entry] = deque()
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._dropped = 0
        self._purged_at = 0.0

    def add(self, entry: Entry) -> None:
        """Queue one entry."""
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self._dropped += 1
            self._pending.append(entry)

    def pending(self) -> int:
        """Entries not written yet."""
        return len(self._pending)

    def _take(self) -> tuple[list[Entry], int]:
        with self._lock:
            batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
            dropped, self._dropped = self._dropped, 0
        return batch, dropped

    def flush(self) -> int:
        """Write what is queued (and purge rows past retention now and then); returns rows
        written. A failed write is logged and its entries are lost (the request is done)."""
        if not self._flushing.acquire(blocking=False):
            return 0
        written = 0
        try:
            while True:
                batch, dropped = self._take()
                if dropped:
                    log.warning("request log: %d entries dropped (over %d queued)", dropped,
                                MAX_PENDING)  # fmt: skip
                if not batch:
                    break
                try:
                    with self.sessions() as session, session.begin():
                        written += write(session, batch)
                except Exception:  # noqa: BLE001 - a logging path must not fail the API
                    log.exception("request log: %d entries not written", len(batch))
            if time.monotonic() - self._purged_at > PURGE_EVERY_S:
                self._purged_at = time.monotonic()
                try:
                    with self.sessions() as session, session.begin():
                        purge(session, self.retention)
                except Exception:  # noqa: BLE001 - retried at the next purge
                    log.exception("request log: purge failed")
        finally:
            self._flushing.release()
        return written


def write(session: Session, entries: list[Entry]) -> int:
    """Insert `entries`, each with the tenant and key its bearer token names (if any)."""
    hashes = {e.key_hash for e in entries if e.key_hash}
    keys: dict[str, tuple[uuid.UUID, uuid.UUID]] = {}
    if hashes:
        rows = session.execute(
            select(ApiKey.key_hash, ApiKey.id, ApiKey.tenant_id).where(ApiKey.key_hash.in_(hashes))
        )
        keys = {h: (kid, tid) for h, kid, tid in rows}
    values: list[dict[str, Any]] = []
    for e in entries:
        key_id, tenant_id = keys.get(e.key_hash or "", (None, None))
        r = e.route or Route()
        values.append(
            {
                "request_id": _text(e.request_id, 128),
                "created_at": e.created_at,
                "tenant_id": tenant_id,
                "api_key_id": key_id,
                "method": _text(e.method, 8),
                "path": _text(e.path, 256),
                "status": e.status,
                "code": _text(e.code or None, 64),
                "message": _text(e.message),
                "detail": _text(e.detail),
                "latency_ms": e.latency_ms,
                "deployment": _text(r.deployment, 128),
                "adapter_id": r.adapter_id,
                "adapter": _text(r.adapter, 128),
                "adapter_version": r.adapter_version,
                "replica": _text(", ".join(r.replicas) or None, 256),
                "in_stream": e.in_stream,
            }
        )
    session.execute(insert(RequestLog), values)
    return len(values)


def purge(session: Session, retention: timedelta) -> int:
    """Delete entries older than `retention`; returns how many."""
    cutoff = datetime.now(UTC) - retention
    result = session.execute(delete(RequestLog).where(RequestLog.created_at < cutoff))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def find(session: Session, request_id: str) -> Any | None:
    """The entry for `request_id` with its tenant's name and key prefix (None if not kept)."""
    stmt = (
        select(RequestLog, Tenant.name.label("tenant"), ApiKey.prefix.label("key_prefix"),
               ApiKey.name.label("key_name"))
        .outerjoin(Tenant, Tenant.id == RequestLog.tenant_id)
        .outerjoin(ApiKey, ApiKey.id == RequestLog.api_key_id)
        .where(RequestLog.request_id == request_id)
        .order_by(RequestLog.id.desc())
        .limit(1)
    )  # fmt: skip
    row = session.execute(stmt).first()
    return None if row is None else row._mapping
