"""A closed connection's transport is freed by reference counting as it closes, not left as a
cycle for a full collection (which holds the event loop 20-50 ms once thousands pile up)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _dead_transports(shim: bool) -> str:
    """In a fresh interpreter (the shim patches the process for good), with the collector
    off: serve 50 connections that open and close, and count the transports still alive."""
    code = textwrap.dedent(
        f"""
        import asyncio, gc, weakref
        if {shim}:
            from loraplex.platform.transport_cycles import free_closed_transports
            free_closed_transports()
        gc.disable()
        alive = []

        async def main():
            def accepted(reader, writer):
                alive.append(weakref.ref(writer.transport))
                writer.close()
            server = await asyncio.start_server(accepted, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            for _ in range(50):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                alive.append(weakref.ref(writer.transport))
                await reader.read()  # the server closed it
                writer.close()
                await writer.wait_closed()
            await asyncio.sleep(0.05)
            server.close()
            await server.wait_closed()

        asyncio.run(main())
        print(sum(r() is not None for r in alive), len(alive))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_closed_transports_are_freed_without_the_collector() -> None:
    assert _dead_transports(shim=True) == "0 100"


def test_without_it_they_wait_for_a_full_collection() -> None:
    """The premise: this interpreter's transports do form the cycle (else the shim is moot
    and this test says so)."""
    alive, total = _dead_transports(shim=False).split()
    assert int(alive) > int(total) // 2, alive


def test_installing_twice_wraps_once() -> None:
    from asyncio import selector_events

    from loraplex.platform.transport_cycles import free_closed_transports

    transport = getattr(selector_events, "_SelectorSocketTransport")  # noqa: B009 - private
    free_closed_transports()
    first = transport._call_connection_lost
    free_closed_transports()
    assert transport._call_connection_lost is first
