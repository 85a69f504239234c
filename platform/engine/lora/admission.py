"""Adapter-aware admission: which waiting requests may join the batch this step.

Rules, applied when the scheduler asks about a waiting request:

* Base-model requests are always admitted (they need no adapter slot).
* At most `max_loras` distinct adapters run at once, so a step never holds more.
* An adapter that is not on the host yet is fetched in the background; its requests wait while
  everything else keeps decoding. One that is on the host is admitted when the device pool can
  hold it (evicting LRU adapters no running request uses).
* Fairness between tenants: while another tenant waits for a slot, a tenant already holding its
  fair share (`max_loras / tenants wanting slots`, at least 1) gets no further slot.
* No adapter starves: once a ready adapter has waited `max_wait_steps` steps, other adapters
  take no new requests until it is in (running ones drain and free their sequences and slots,
  as in LoRAX's rotation), so an adapter's wait is bounded whatever the others' backlog.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from loraplex.platform.engine.request import Request


class AdapterTiers(Protocol):
    """What the policy asks of the runtime about an adapter's weights (`tiers.LoraTiers`)."""

    def ready_rows(self, key: str) -> int | None:
        """Rank rows the adapter needs on the device when its weights are on the host or device;
        None while the fetch runs (starting it if needed). Raises if the fetch failed."""
        ...

    def can_hold(self, key: str, rows: int) -> bool:
        """Could the device pool make it resident now?"""
        ...

    def is_ready(self, key: str) -> bool:
        """Are its weights on the host or the device (no fetch started)?"""
        ...

    def activate(self, key: str) -> None:
        """Make the adapter resident and hold it (first running request)."""
        ...

    def deactivate(self, key: str) -> None:
        """Its last running request left."""
        ...

    def fail_request(self, request: Request, error: BaseException) -> None:
        """The adapter cannot be served: the engine should finish the request with an error."""
        ...


@dataclass
class _Waiting:
    tenant: str
    since: int
    seen: int
    ready: bool = False


def tenant_of(request: Request) -> str:
    """A request's tenant (from its adapter handle), else its adapter as its own tenant."""
    tenant = getattr(request.adapter, "tenant", None)
    return tenant if tenant is not None else f"adapter:{request.adapter_key}"


class LoraAdmissionPolicy:
    """The scheduler's admission policy for multi-LoRA batches (see the module docstring).

    Steps are the scheduler's: `begin_step` hands over its step number and its waiting queue
    (read, never changed), which lets fairness see every tenant that wants a slot, not only
    those asked about so far this step.
    """

    def __init__(self, tiers: AdapterTiers, max_loras: int, max_wait_steps: int) -> None:
        self.tiers = tiers
        self.max_loras = max_loras
        self.max_wait_steps = max_wait_steps
        self.step = 0
        self._queue: Iterable[Request] | None = None
        self._refreshed_at: int | None = None
        self.running: Counter[str] = Counter()  # adapter key -> running requests
        self.active_tenant: dict[str, str] = {}
        self.waiting: dict[str, _Waiting] = {}

    # -- views -------------------------------------------------------------------------

    def _refresh(self) -> None:
        step = self.step
        if self._queue is None or self._refreshed_at == step:
            self._expire()
            return
        self._refreshed_at = step
        now: dict[str, str] = {}
        for r in self._queue:
            if r.adapter_key is not None and r.adapter_key not in self.running:
                now.setdefault(r.adapter_key, tenant_of(r))
        for key in [k for k in self.waiting if k not in now]:
            del self.waiting[key]
        for key, tenant in now.items():
            w = self.waiting.get(key)
            if w is None:
                w = self.waiting[key] = _Waiting(tenant=tenant, since=step, seen=step)
            w.seen = step
            w.ready = self.tiers.is_ready(key)

    def _expire(self) -> None:
        step = self.step
        stale = [k for k, w in self.waiting.items() if w.seen < step - self.max_wait_steps]
        for key in stale:
            del self.waiting[key]  # not asked about for a while: its requests went away

    def _starving(self) -> list[str]:
        step = self.step
        return [
            k for k, w in self.waiting.items() if w.ready and step - w.since >= self.max_wait_steps
        ]

    def _fair_share(self) -> int:
        tenants = set(self.active_tenant.values()) | {w.tenant for w in self.waiting.values()}
        return max(1, math.floor(self.max_loras / max(1, len(tenants))))

    # -- AdmissionPolicy ----------------------------------------------------------------

    def begin_step(self, step: int, waiting: Iterable[Request]) -> None:
        """The scheduler starts admitting for its step `step`; `waiting` is its live queue."""
        self.step = step
        self._queue = waiting

    def can_admit(self, request: Request) -> bool:
        """May this waiting request join the batch now?"""
        key = request.adapter_key
        if key is None:
            return True
        self._refresh()
        step = self.step
        starving = [k for k in self._starving() if k != key]
        if key in self.running:
            # Round-robin between adapters: while another adapter has waited too long, active
            # adapters take no new requests, so they drain and free sequences and slots.
            return not starving
        tenant = tenant_of(request)
        w = self.waiting.get(key)
        if w is None:
            w = self.waiting[key] = _Waiting(tenant=tenant, since=step, seen=step)
        w.seen = step
        try:
            rows = self.tiers.ready_rows(key)
        except Exception as exc:  # the fetch failed: this request can never run
            self.waiting.pop(key, None)
            self.tiers.fail_request(request, exc)
            return False
        w.ready = rows is not None
        if rows is None or len(self.running) >= self.max_loras:
            return False
        if starving and key not in self._starving():
            return False  # the adapters that waited longest go first
        others_waiting = any(o.tenant != tenant and o.ready for o in self.waiting.values())
        held = sum(1 for t in self.active_tenant.values() if t == tenant)
        if others_waiting and held >= self._fair_share():
            return False
        return self.tiers.can_hold(key, rows)

    def on_admitted(self, request: Request) -> None:
        """Count the request; the adapter's first running request makes it resident."""
        key = request.adapter_key
        if key is None:
            return
        if self.running[key] == 0:
            self.tiers.activate(key)
            self.active_tenant[key] = tenant_of(request)
            self.waiting.pop(key, None)
        self.running[key] += 1

    def on_released(self, request: Request) -> None:
        """Uncount the request; the adapter's last one releases its device hold."""
        key = request.adapter_key
        if key is None or self.running[key] == 0:
            return
        self.running[key] -= 1
        if self.running[key] == 0:
            del self.running[key]
            self.active_tenant.pop(key, None)
            self.tiers.deactivate(key)
