"""The bounded per-stream buffer: slow readers are cut off after the stall timeout, and a
closed (disconnected) stream closes its source at once so the replica request is aborted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from loraplex.platform.gateway.streaming import DONE, bounded_relay, sse, sse_error


def test_frames() -> None:
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert DONE == b"data: [DONE]\n\n"
    err = json.loads(sse_error("boom", code="x")[6:])
    assert err == {"error": {"message": "boom", "type": "server_error", "param": None, "code": "x"}}


async def _until(cond, timeout_s: float) -> None:
    """Wait (without blocking the loop) until `cond()`; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


class Source:
    """A frame source that records how far it got and whether it was closed."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay
        self.produced = 0
        self.closed_at: float | None = None

    async def gen(self):
        try:
            for i in range(self.n):
                if self.delay:
                    await asyncio.sleep(self.delay)
                self.produced += 1
                yield sse({"i": i})
            yield DONE
        finally:
            self.closed_at = time.monotonic()


def test_fast_reader_gets_everything() -> None:
    async def main() -> list[bytes]:
        src = Source(50)
        return [f async for f in bounded_relay(src.gen(), max_buffer=4, stall_timeout_s=1.0)]

    writes = asyncio.run(main())
    frames = [f + b"\n\n" for w in writes for f in w.split(b"\n\n") if f]
    assert frames == [sse({"i": i}) for i in range(50)] + [DONE]  # all of them, in order


def test_slow_reader_is_aborted_after_timeout() -> None:
    async def main() -> tuple[Source, list[bytes], float]:
        src = Source(1000)
        relay = bounded_relay(src.gen(), max_buffer=8, stall_timeout_s=0.3)
        first = await anext(relay)
        t0 = time.monotonic()
        # The client reads nothing: the relay must close the source by itself.
        await _until(lambda: src.closed_at is not None, timeout_s=10)
        closed_after = src.closed_at - t0
        rest = [f async for f in relay]
        return src, [first, *rest], closed_after

    src, frames, closed_after = asyncio.run(main())
    assert closed_after >= 0.25  # it waited for the stall timeout (0.3 s), then cut it off
    taken = frames[0].count(b"data: ")  # the first read took what had piled up, as one write
    assert src.produced <= taken + 8 + 2  # bounded: it never ran ahead of the buffer
    last = json.loads(frames[-1][6:])
    assert last["error"]["code"] == "stream_stalled"
    assert DONE not in frames


def test_disconnect_closes_source_at_once() -> None:
    async def main() -> tuple[Source, float]:
        src = Source(1000, delay=0.01)
        relay = bounded_relay(src.gen(), max_buffer=4, stall_timeout_s=5.0)

        async def client() -> None:
            async for _ in relay:
                pass

        task = asyncio.create_task(client())
        await _until(lambda: src.produced >= 3, timeout_s=10)  # the client is reading
        t0 = time.monotonic()
        task.cancel()  # what Starlette does when the HTTP client goes away
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await _until(lambda: src.closed_at is not None, timeout_s=10)
        return src, src.closed_at - t0

    src, latency = asyncio.run(main())
    assert src.produced < 500  # closed long before its 1000 tokens (10 s) were produced


def test_source_failure_becomes_error_event(caplog: pytest.LogCaptureFixture) -> None:
    """The client gets a generic error event; what failed is only in the log."""

    async def bad():
        yield sse({"ok": 1})
        raise RuntimeError("replica went away")

    async def main() -> list[bytes]:
        return [f async for f in bounded_relay(bad(), max_buffer=4, stall_timeout_s=1.0)]

    frames = asyncio.run(main())
    assert json.loads(frames[0][6:]) == {"ok": 1}
    err = json.loads(frames[-1][6:])["error"]
    assert err["code"] == "stream_failed" and "replica went away" not in err["message"]
    assert "replica went away" in caplog.text


def test_gateway_shutdown_sends_pending_aborts(settings, pg_url: str, redis_url: str) -> None:
    """Aborts run detached; closing the gateway waits for them before its HTTP client goes, so
    a replica hears about a client that left just before shutdown."""
    from redis.asyncio import Redis
    from support.scripted_replica import ScriptedReplica

    from loraplex.platform.db.session import make_sessionmaker
    from loraplex.platform.gateway.service import Gateway
    from loraplex.platform.gateway.streaming import spawn

    async def main(url: str) -> None:
        gw = Gateway(settings, Redis.from_url(redis_url), make_sessionmaker(pg_url))
        await gw.start()

        async def late_abort() -> None:
            await asyncio.sleep(0.2)  # still in flight when close() begins
            await gw.client.abort(url, "left-early")

        spawn(late_abort())
        await gw.close()

    with ScriptedReplica([1]) as replica:
        asyncio.run(main(replica.url))
        assert replica.aborted == ["left-early"]
