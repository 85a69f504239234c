"""The engine's seams as Protocols: what the core needs from a LoRA runtime, and what the
replica's server (its engine loop) needs from an engine.

`EngineCore` talks to the multi-LoRA runtime (`lora/runtime.py`) only through
`LoraRuntimeProtocol`; the server drives an `EngineCore` or an expert-parallel `EPEngine`
only through `ServedEngine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from loraplex.adapters.static_meta import StaticLoraMeta
    from loraplex.platform.engine.metrics import EngineMetrics
    from loraplex.platform.engine.outputs import RequestDelta
    from loraplex.platform.engine.request import Request
    from loraplex.platform.engine.sampling_params import SamplingParams
    from loraplex.platform.engine.scheduler import AdmissionPolicy
    from loraplex.platform.wire import ReplicaState


class LoraRuntimeProtocol(Protocol):
    """A multi-LoRA runtime as the engine core sees it."""

    @property
    def admission_policy(self) -> AdmissionPolicy:
        """The scheduler's gate on waiting requests (adapter slots, fairness)."""
        ...

    def resolve_adapter(self, ref: Any) -> tuple[str, object]:
        """A request's adapter reference -> (version key for caches, handle for the request);
        ValueError for a reference it refuses."""
        ...

    def prepare_step(self, requests: list[Request], num_tokens: list[int]) -> object | None:
        """The step's LoRA metadata (put in `ForwardContext.lora`), None for a base-only step."""
        ...

    def take_failed_request_ids(self) -> list[str]:
        """Requests whose adapter failed to load since the last call (the engine aborts them)."""
        ...

    def warm(self, ref: Any) -> str:
        """Start bringing an adapter version into the host tier before any request needs it:
        "fetching", "on_host", "resident", or "full" (no free host room: nothing evicted)."""
        ...

    def static_lora_meta(self, max_batch: int) -> StaticLoraMeta:
        """Graph-static LoRA buffers for decode graphs of up to `max_batch` rows."""
        ...

    @property
    def resident_adapters(self) -> list[str]:
        """Version keys of adapters in device memory (for /state and the router)."""
        ...

    @property
    def adapter_references(self) -> int:
        """Device-slot references running requests hold (0 when the replica is idle)."""
        ...

    def detach(self) -> None:
        """Remove the model's LoRA hooks (it serves the base alone again) and stop fetching."""
        ...


class ServedEngine(Protocol):
    """What the replica's engine loop and HTTP server drive (one thread steps it)."""

    @property
    def metrics(self) -> EngineMetrics:
        """The engine's Prometheus metrics (its own registry)."""
        ...

    @property
    def last_num_scheduled_tokens(self) -> int:
        """Tokens the last step ran (0: it was idle)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model folder's tokenizer (None when it has none): logprob keys need it."""
        ...

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        adapter: Any | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """Queue a request."""
        ...

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free its blocks."""
        ...

    def warm_adapter(self, ref: Any) -> str:
        """`LoraRuntimeProtocol.warm` on this engine's runtime (ValueError without one)."""
        ...

    def computed_prompt_tokens(self, request_id: str) -> int | None:
        """Prompt tokens computed so far for a live request (prefix-cache hits excluded)."""
        ...

    def has_unfinished(self) -> bool:
        """Requests wait or run (or an abort is not reported yet)."""
        ...

    def step(self) -> Sequence[RequestDelta]:
        """One engine step; what changed for each request."""
        ...

    def state(self) -> ReplicaState:
        """The /state snapshot."""
        ...

    def install_lora_runtime(self, runtime: LoraRuntimeProtocol) -> None:
        """Serve adapters through `runtime`."""
        ...

    def close(self) -> None:
        """Release what the engine holds (threads, process groups)."""
        ...


class EngineDriver(Protocol):
    """What the replica's HTTP server asks of the engine it serves: `EngineLoop` (the engine
    on a thread of this process) and `EngineProcess` (the engine in a process of its own)."""

    queues: dict[str, Any]
    error: str | None

    @property
    def alive(self) -> bool:
        """True while the engine serves."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (logprob token text), or None."""
        ...

    def start(self) -> None:
        """Begin (called on the event loop that serves the requests)."""
        ...

    async def stop(self) -> None:
        """Stop after the current step."""
        ...

    def close(self) -> None:
        """Release the engine (after `stop`)."""
        ...

    async def add(self, add: Any) -> Any:
        """Add a request (`engine_loop.PendingAdd`); its delta queue."""
        ...

    async def warm(self, adapter: Any) -> str:
        """Warm an adapter: `ServedEngine.warm_adapter`'s answer."""
        ...

    def abort(self, request_id: str) -> bool:
        """Abort at the next step boundary; False for an unknown id."""
        ...

    async def prompt_tokens_computed(self, request_id: str) -> int | None:
        """Prompt tokens computed for a request: live, or at its abort."""
        ...

    async def state_json(self) -> str:
        """The `/state` document."""
        ...

    async def metrics_exposition(self) -> bytes:
        """The Prometheus exposition."""
        ...
