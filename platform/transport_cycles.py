"""Closed connections freed at once, not by the cycle collector.

CPython 3.11's selector socket transport keeps a bound method of itself (`_read_ready_cb`)
after its connection is lost, so every closed connection is a reference cycle that only a
full collection frees. A server that closes connections by the thousand (the replica, one
per stream; the API, one per refused client and per replica stream) piles them up, and each
full collection then holds the event loop 20-50 ms (`loop_watch`'s reports under
`loraplex bench neighbors`: 1,180 dead transports in 8 s). Once the connection is lost,
nothing reads that attribute again, so dropping it there lets reference counting free the
transport, its socket and its protocol as the connection ends.
"""

from __future__ import annotations

from asyncio import selector_events
from typing import Any

_MARK = "_loraplex_drops_read_callback"


def _nothing() -> None:
    """What a transport calls on a read after its connection was lost: nothing (a plain
    function, so the transport holds no reference to itself)."""


def free_closed_transports() -> None:
    """Make selector socket transports drop their self-referencing read callback when their
    connection is lost (once per process; a no-op where the transport has no such
    attribute)."""
    cls: Any = getattr(selector_events, "_SelectorSocketTransport", None)
    if cls is None:
        return
    if getattr(cls, _MARK, False) or not hasattr(cls, "_read_ready__data_received"):
        return
    lost = cls._call_connection_lost

    def _call_connection_lost(self: Any, exc: BaseException | None) -> None:
        try:
            lost(self, exc)
        finally:
            self._read_ready_cb = _nothing

    cls._call_connection_lost = _call_connection_lost
    setattr(cls, _MARK, True)


__all__ = ["free_closed_transports"]
