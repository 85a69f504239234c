"""The engine in a process of its own, driven from the replica's HTTP server.

One Python process shares one GIL: with the engine stepping on a thread beside the server,
every frame the server writes to a stream holds back the engine's next kernel launch (a
replica serving 64 streams spent a fifth of its stepping thread's time waiting to hand a
step over). Here the engine steps in a child process (`_child_main`, started with `spawn`)
and the server talks to it over two pipes: commands one way (adds, aborts, warms, questions),
results the other (a step's deltas in one message, answers). The parent has no torch work
and the child no HTTP work. `EngineProcess` offers the server what `EngineLoop` offers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

from loraplex.loader.storage import StorageConfig
from loraplex.platform.engine.engine_loop import (
    ABORTED_KEPT,
    IDLE_POLL_S,
    STOP_WAIT_S,
    DeltaQueue,
    PendingAdd,
)
from loraplex.platform.engine_spec.config import EngineConfig

log = logging.getLogger(__name__)

# The engine process runs a little below the server's priority: where they share a core, the
# server's request handling (short, and what every stream's latency waits on) runs when it
# wakes and the engine takes the rest. On a shared core under attack traffic (bench
# neighbors, all attacks at once) the bystander's TTFT p95 was 17.7x quiet at equal priority,
# 4.6x with this.
ENGINE_NICE = 5


class EngineProcessFailed(RuntimeError):
    """The engine process could not start, or ended while serving."""


def build_served_engine(config: EngineConfig, storage: StorageConfig | None) -> Any:
    """The replica's engine for `config`: the model (an expert-parallel group when asked), and
    when it serves adapters and has an object store (`storage`), a LoRA runtime that fetches
    them from there (adapters come as `AdapterRef`s, never local paths)."""
    from loraplex.platform.engine.ep_engine import EPEngine, build_engine

    core = build_engine(config)
    if config.serves_adapters and storage is not None:
        from loraplex.loader.object_store import ObjectStore
        from loraplex.platform.engine.lora import LoraRuntime

        leader = core.core if isinstance(core, EPEngine) else core  # EP: rank 0 fetches
        core.install_lora_runtime(
            LoraRuntime.for_engine(
                leader, object_store=ObjectStore(storage), allow_local_paths=False
            )
        )
    return core


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it crosses a pipe intact, else a RuntimeError with its text."""
    try:
        return pickle.loads(pickle.dumps(exc))  # type: ignore[no-any-return]  # an exception
    except Exception:  # noqa: BLE001 - any exception that does not round-trip
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _child_main(
    config: EngineConfig,
    storage: StorageConfig | None,
    commands: Connection,
    results: Connection,
    log_level: int = logging.INFO,
) -> None:
    """The engine process: build, say ready, then apply commands between steps until told to
    stop or the parent goes (its pipe closes). Interrupts are the parent's to handle: a Ctrl-C
    or SIGTERM to the group ends this process through the parent's stop, after its drain."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level)  # the server's level
    with contextlib.suppress(OSError):  # the server's short, latency-bound work goes first
        os.nice(ENGINE_NICE)
    try:
        core = build_served_engine(config, storage)
    except BaseException as exc:  # reported to the parent, which fails the replica's start
        results.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    results.send(("ready", None))
    try:
        _serve(core, commands, results)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent went away
    finally:
        core.close()


def _serve(core: Any, commands: Connection, results: Connection) -> None:
    live: set[str] = set()  # requests added and not yet finished or aborted
    while True:
        busy = core.has_unfinished()
        if commands.poll(0 if busy else None):
            while True:
                if not _apply(core, commands.recv(), results, live):
                    return
                if not commands.poll(0):
                    break
        if not core.has_unfinished():
            continue
        try:
            deltas = core.step()
        except Exception as exc:  # keep serving: fail the live requests, free their blocks
            log.exception("engine step failed")
            failed = sorted(live)
            for rid in failed:
                core.abort_request(rid)
            live.clear()
            results.send(("step_failed", failed, f"engine step failed: {exc}"))
            continue
        if deltas:
            live.difference_update(d.request_id for d in deltas if d.finished)
            results.send(("deltas", list(deltas)))
        elif core.last_num_scheduled_tokens == 0:
            commands.poll(IDLE_POLL_S)


def _apply(core: Any, msg: tuple[Any, ...], results: Connection, live: set[str]) -> bool:
    """Apply one command; False: stop."""
    kind = msg[0]
    if kind == "stop":
        return False
    if kind == "add":
        _, wire, params = msg
        try:
            core.add_request(
                wire.prompt_token_ids, params, wire.request_id, wire.adapter, wire.cache_salt
            )
            live.add(wire.request_id)
            results.send(("added", wire.request_id, None))
        except Exception as exc:  # handed to the waiting handler, which answers 4xx
            results.send(("added", wire.request_id, _portable(exc)))
    elif kind == "abort":
        rid = msg[1]
        live.discard(rid)
        computed = core.computed_prompt_tokens(rid)
        if core.abort_request(rid):
            results.send(("aborted", rid, computed))
    else:  # a question with a token: warm, state, metrics, computed
        token = msg[1]
        try:
            if kind == "warm":
                value: Any = core.warm_adapter(msg[2])
            elif kind == "state":
                value = core.state().model_dump_json()
            elif kind == "metrics":
                value = core.metrics.render()
            elif kind == "computed":
                value = core.computed_prompt_tokens(msg[2])
            else:
                raise ValueError(f"unknown engine command {kind!r}")
            results.send(("answer", token, value, None))
        except Exception as exc:  # the asker re-raises it
            results.send(("answer", token, None, _portable(exc)))
    return True


class EngineProcess:
    """The parent's side: per-request delta queues, and the pipes to the engine process."""

    def __init__(self, config: EngineConfig, storage: StorageConfig | None = None) -> None:
        self.config = config
        self.queues: dict[str, DeltaQueue] = {}
        self.error: str | None = None
        self.tokenizer: Any = None
        self._adds: dict[str, PendingAdd] = {}
        self._answers: dict[int, asyncio.Future[Any]] = {}
        self._tokens = itertools.count()
        self._computed_at_abort: OrderedDict[str, int] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._writer: threading.Thread | None = None
        self._outgoing: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._stopping = False
        self._gone = False  # the engine process ended while serving
        ctx = multiprocessing.get_context("spawn")
        commands_in, self._commands_out = ctx.Pipe(duplex=False)  # (receiving, sending) ends
        self._results_in, results_out = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child_main,
            args=(config, storage, commands_in, results_out, logging.getLogger().level),
            name="loraplex-engine",
            daemon=False,  # an expert-parallel engine starts processes of its own
        )
        self._child_ends = (commands_in, results_out)

    def launch(self) -> None:
        """Start the engine process and wait until its engine is built (the cold start);
        raises `EngineProcessFailed` with the child's error when it cannot start."""
        self._proc.start()
        for end in self._child_ends:
            end.close()  # the child holds them now: a dead child reads as EOF here
        try:
            kind, detail = self._results_in.recv()
        except EOFError:
            raise EngineProcessFailed(
                f"the engine process exited (code {self._proc.exitcode}) while starting"
            ) from None
        if kind != "ready":
            self._proc.join(STOP_WAIT_S)
            raise EngineProcessFailed(f"the engine could not start: {detail}")
        self.tokenizer = self._load_tokenizer()

    def _load_tokenizer(self) -> Any:
        """The model's tokenizer, for logprob token text (the parent's own copy)."""
        from loraplex.loader.timeline import Timeline
        from loraplex.platform.engine.model_source import open_model_source

        cfg = self.config
        source = open_model_source(cfg.model, cfg.storage, Timeline(cfg.model), cfg.tokenizer)
        return source.load_tokenizer()

    # ---------------------------------------------------------------- the server's calls

    def start(self) -> None:
        """Start reading results and writing commands (call from the event loop that serves
        the requests)."""
        self._loop = asyncio.get_running_loop()
        self._reader = threading.Thread(target=self._read, name="engine-results", daemon=True)
        self._reader.start()
        self._writer = threading.Thread(target=self._write, name="engine-commands", daemon=True)
        self._writer.start()

    async def stop(self) -> None:
        """Stop the engine process after its current step."""
        self._stopping = True
        self._outgoing.put(("stop",))
        self._outgoing.put(None)
        await asyncio.to_thread(self._proc.join, STOP_WAIT_S)
        if self._proc.is_alive():
            self._proc.kill()

    def close(self) -> None:
        """Make sure the engine process is gone (after `stop`, or when serving never began)."""
        if self._proc.is_alive():
            if self._writer is None:
                with contextlib.suppress(OSError):
                    self._commands_out.send(("stop",))
            else:
                self._outgoing.put(("stop",))
            self._proc.join(STOP_WAIT_S)
        if self._proc.is_alive():
            self._proc.kill()

    @property
    def alive(self) -> bool:
        """True while the engine process serves."""
        return self._proc.is_alive() and not self._gone and not self._stopping

    async def add(self, add: PendingAdd) -> DeltaQueue:
        """Send a request to the engine; raises what `add_request` raises there."""
        rid = add.request_id
        if rid in self.queues:
            raise KeyError(rid)
        queue: DeltaQueue = asyncio.Queue()
        self.queues[rid] = queue
        self._adds[rid] = add
        self._send(("add", add.wire, add.params))
        try:
            await add.done
        except BaseException:
            self.queues.pop(rid, None)
            self._adds.pop(rid, None)
            raise
        return queue

    async def warm(self, adapter: Any) -> str:
        """Warm `adapter` in the engine (`ServedEngine.warm_adapter`'s answer)."""
        return str(await self._ask("warm", adapter))

    def abort(self, request_id: str) -> bool:
        """Ask for an abort at the next step boundary; False for an unknown id."""
        if request_id not in self.queues:
            return False
        self._send(("abort", request_id))
        return True

    async def prompt_tokens_computed(self, request_id: str) -> int | None:
        """Prompt tokens computed for `request_id`: live, or at its abort; None if unknown."""
        if request_id in self.queues:
            live = await self._ask("computed", request_id)
            if live is not None:
                return int(live)
        return self._computed_at_abort.get(request_id)

    async def state_json(self) -> str:
        """The engine's `/state` document."""
        return str(await self._ask("state"))

    async def metrics_exposition(self) -> bytes:
        """The engine's Prometheus exposition."""
        return bytes(await self._ask("metrics"))

    def _send(self, msg: tuple[Any, ...]) -> None:
        """Queue a command for the writer thread: a pipe the engine has not drained yet (it
        reads between steps) must never block the event loop every stream runs on."""
        if self._gone:
            raise EngineProcessFailed(self.error or "the engine process is gone")
        self._outgoing.put(msg)

    def _write(self) -> None:
        while (msg := self._outgoing.get()) is not None:
            try:
                self._commands_out.send(msg)
            except OSError:
                return  # the engine process is gone: the reader sees its pipe close

    async def _ask(self, kind: str, *args: Any) -> Any:
        assert self._loop is not None
        token = next(self._tokens)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._answers[token] = fut
        try:
            self._send((kind, token, *args))
            return await fut
        finally:
            self._answers.pop(token, None)

    # ---------------------------------------------------------------- results (reader thread)

    def _read(self) -> None:
        assert self._loop is not None
        while True:
            try:
                msg = self._results_in.recv()
            except (EOFError, OSError):
                msg = ("gone", None)
            with contextlib.suppress(RuntimeError):  # the event loop is closing
                self._loop.call_soon_threadsafe(self._on_result, msg)
            if msg[0] == "gone":
                return

    def _on_result(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "deltas":
            for d in msg[1]:
                out = self.queues.get(d.request_id)
                if out is not None:
                    out.put_nowait(d)
                    if d.finished:
                        self.queues.pop(d.request_id, None)
        elif kind == "added":
            _, rid, exc = msg
            add = self._adds.pop(rid, None)
            if add is None:
                return
            if add.done.done():  # the client left before the add landed: drop the request
                if exc is None:
                    self._send(("abort", rid))
            elif exc is not None:
                add.done.set_exception(exc)
            else:
                add.done.set_result(None)
        elif kind == "aborted":
            _, rid, computed = msg
            if computed is not None:
                self._computed_at_abort[rid] = computed
                while len(self._computed_at_abort) > ABORTED_KEPT:
                    self._computed_at_abort.popitem(last=False)
        elif kind == "answer":
            _, token, value, exc = msg
            fut = self._answers.get(token)
            if fut is not None and not fut.done():
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(value)
        elif kind == "step_failed":
            _, failed, reason = msg
            self.error = reason  # as the in-process loop reports it; the replica keeps serving
            self._fail(failed, RuntimeError(reason))
        elif kind == "gone" and not self._stopping:
            self._gone = True
            self.error = f"the engine process exited (code {self._proc.exitcode})"
            log.error("%s", self.error)
            exc = EngineProcessFailed(self.error)
            self._fail(list(self.queues), exc)
            for fut in self._answers.values():
                if not fut.done():
                    fut.set_exception(exc)
            for add in self._adds.values():
                if not add.done.done():
                    add.done.set_exception(exc)

    def _fail(self, request_ids: list[str], exc: Exception) -> None:
        """End the streams of `request_ids` with `exc`."""
        for rid in request_ids:
            q = self.queues.pop(rid, None)
            if q is not None:
                q.put_nowait(exc)
