"""An expert-parallel engine group from one call: rank 0 serves, ranks 1..N-1 follow.

Rank 0 (the calling process) runs the ordinary `EngineCore`: scheduler, KV manager,
sampler, the server on top. Before every forward it broadcasts the step's scheduled batch;
the follower ranks (spawned processes) run the same forward on their own replica of
attention and KV cache, so every rank reaches each MoE layer together and exchanges tokens
all-to-all. Each rank builds its model inside its EP group, holding only its experts, and
reads only those experts' tensors (and fused-expert rows) from the model source; what each
rank loaded is gathered on rank 0 (`EPEngine.rank_loads`).
A rebalance (EPLB) is broadcast the same way and happens between two steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch.distributed as dist
import torch.multiprocessing as mp

from loraplex.moe.ep_launch import StepChannel, ep_backend, free_loopback_port, init_ep_rank
from loraplex.moe.expert_parallel import set_process_ep_group
from loraplex.moe.rebalancer import BalancedModel, ExpertRebalancer, LayerRebalance
from loraplex.platform.engine.engine_core import EngineCore
from loraplex.platform.engine.metrics import EngineMetrics
from loraplex.platform.engine.outputs import RequestDelta
from loraplex.platform.engine.ports import LoraRuntimeProtocol
from loraplex.platform.engine.request import Request
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine.scheduler import ScheduledRequest, SchedulerOutput
from loraplex.platform.engine_spec.config import EngineConfig
from loraplex.platform.wire import ReplicaState


def _portable(out: SchedulerOutput) -> SchedulerOutput:
    """The batch without per-request host objects (adapter handles, RNGs) followers never use."""
    return SchedulerOutput(
        scheduled=[
            ScheduledRequest(
                dataclasses.replace(s.request, adapter=None, generator=None),
                s.num_tokens,
                s.start,
            )
            for s in out.scheduled
        ]
    )


class EPEngine:
    """Rank 0's handle (a `ports.ServedEngine`): an `EngineCore` built to send each step's
    batch to the follower ranks before its forward, plus the periodic rebalance; `close`
    stops the followers.
    """

    def __init__(
        self,
        core: EngineCore,
        channel: StepChannel,
        procs: list[Any],
        rebalancer: ExpertRebalancer | None,
        rank_loads: list[dict[str, int]] | None = None,
        lora_box: list[Any] | None = None,
    ) -> None:
        self.core = core
        self.lora_box = lora_box  # [LeaderMirror | None], read by the step sender
        self.rank_loads: list[dict[str, int]] = rank_loads or []
        """Per rank, what its cold start loaded (`weight_tensors`, `weight_bytes`, ...)."""
        self.channel = channel
        self.procs = procs
        self.rebalancer = rebalancer
        self.last_rebalance: list[LayerRebalance] = []

    @property
    def metrics(self) -> EngineMetrics:
        """Rank 0's metrics (balancedness included)."""
        return self.core.metrics

    @property
    def last_num_scheduled_tokens(self) -> int:
        """Tokens the last step ran."""
        return self.core.last_num_scheduled_tokens

    @property
    def tokenizer(self) -> Any:
        """Rank 0's tokenizer (followers never detokenize)."""
        return self.core.tokenizer

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        adapter: Any | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """Queue a request on rank 0's scheduler."""
        return self.core.add_request(prompt, params, request_id, adapter, cache_salt)

    def warm_adapter(self, ref: Any) -> str:
        """Warm on rank 0 (followers get the adapter with the step that first uses it)."""
        return self.core.warm_adapter(ref)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now; followers just stop seeing it in the batches."""
        return self.core.abort_request(request_id)

    def computed_prompt_tokens(self, request_id: str) -> int | None:
        """Prompt tokens rank 0 has computed for a live request."""
        return self.core.computed_prompt_tokens(request_id)

    def has_unfinished(self) -> bool:
        """Requests wait or run on rank 0."""
        return self.core.has_unfinished()

    def state(self) -> ReplicaState:
        """Rank 0's /state."""
        return self.core.state()

    def install_lora_runtime(self, runtime: LoraRuntimeProtocol) -> None:
        """Serve adapters on every rank: followers build the same runtime, and each step's
        batch carries the adapters rank 0 loaded since the last one (`lora.ep_mirror`)."""
        from loraplex.platform.engine.lora.ep_mirror import LeaderMirror
        from loraplex.platform.engine.lora.runtime import LoraRuntime

        if not isinstance(runtime, LoraRuntime) or self.lora_box is None:
            raise NotImplementedError(
                "an expert-parallel engine serves adapters through its own LoraRuntime only"
            )
        self.channel.send(("lora", None))
        self.core.install_lora_runtime(runtime)
        self.lora_box[0] = LeaderMirror(runtime)

    def step(self) -> list[RequestDelta]:
        """One engine step on every rank (and a rebalance when its interval is reached)."""
        deltas = self.core.step()
        rb = self.rebalancer
        if rb is not None and rb.interval_steps:
            rb.steps += 1
            if rb.steps % rb.interval_steps == 0:
                self.rebalance()
        return deltas

    def rebalance(self) -> list[LayerRebalance]:
        """Rebalance every MoE layer now, on all ranks, between two steps."""
        if self.rebalancer is None:
            raise ValueError("this engine was started without a rebalancer")
        self.channel.send(("rebalance", None))
        self.last_rebalance = self.rebalancer.rebalance()
        return self.last_rebalance

    def close(self) -> None:
        """Stop the followers and leave the process group."""
        if self.procs:
            self.channel.stop()
            for p in self.procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
            self.procs = []
            set_process_ep_group(None)
            dist.destroy_process_group()


def _follower_lora(core: EngineCore) -> Any:
    """A follower's LoRA runtime (sized like rank 0's) and the mirror of rank 0's adapters."""
    from loraplex.platform.engine.lora.ep_mirror import FollowerMirror
    from loraplex.platform.engine.lora.runtime import LoraRuntime

    runtime = LoraRuntime.for_engine(core)
    core.install_lora_runtime(runtime)
    return FollowerMirror(runtime)


def _follower_main(
    rank: int, world_size: int, port: int, backend: str, config: EngineConfig, redundant: int
) -> None:
    ep = init_ep_rank(rank, world_size, port, backend)
    channel = StepChannel(ep)
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)  # the leader's KV block count
    core = EngineCore(dataclasses.replace(config, num_gpu_blocks=box[0]))
    dist.gather_object(dict(core.timeline.counts), None, dst=0)
    # A MoE model (checked on rank 0 before the followers start): its blocks and recorder.
    rebalancer = ExpertRebalancer(cast(BalancedModel, core.model), redundant)

    mirror: list[Any] = [None]

    def execute(message: tuple[str, Any]) -> None:
        kind, payload = message
        if kind == "step":
            core.runner.execute(payload)
        elif kind == "lora":
            mirror[0] = _follower_lora(core)
        elif kind == "lora_step":
            updates, out = payload
            mirror[0].apply(updates)
            held = mirror[0].hold(s.request for s in out.scheduled)
            try:
                core.runner.execute(out)
            finally:
                mirror[0].release(held)
        elif kind == "rebalance":
            rebalancer.rebalance()
        else:
            raise RuntimeError(f"unknown expert-parallel command {kind!r}")

    try:
        channel.follow(execute)
    finally:
        set_process_ep_group(None)
        dist.destroy_process_group()


def start_ep_engine(
    config: EngineConfig,
    ep_size: int,
    *,
    num_redundant: int = 0,
    rebalance_interval: int = 0,
    backend: str | None = None,
    registry: Any | None = None,
) -> EPEngine:
    """Spawn ranks 1..ep_size-1, join as rank 0, load the model on every rank.

    `num_redundant` extra expert copies are added at each rebalance (EPLB);
    `rebalance_interval` steps between automatic rebalances (0: only on `rebalance()`).
    """
    if ep_size < 2:
        raise ValueError(f"an expert-parallel engine needs ep_size >= 2, got {ep_size}")
    backend = backend or ep_backend(config.device, ep_size)
    port = free_loopback_port()
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=_follower_main,
            args=(r, ep_size, port, backend, config, num_redundant),
            daemon=True,
        )
        for r in range(1, ep_size)
    ]
    for p in procs:
        p.start()
    try:
        ep = init_ep_rank(0, ep_size, port, backend)
        channel = StepChannel(ep)

        lora_box: list[Any] = [None]

        def send_batch(out: SchedulerOutput) -> None:
            mirror = lora_box[0]
            if mirror is None:
                channel.send(("step", _portable(out)))
            else:
                channel.send(("lora_step", (mirror.updates(), _portable(out))))
                mirror.send_rows()  # each follower's expert rows, to it alone

        core = EngineCore(config, before_forward=send_batch)
        if getattr(core.model, "moe_blocks", None) is None:
            raise ValueError(f"{config.model} is not a MoE model; expert parallelism needs experts")
        dist.broadcast_object_list([core.pool.num_blocks], src=0)
        rank_loads: list[Any] = [None] * ep_size
        dist.gather_object(dict(core.timeline.counts), rank_loads, dst=0)
        if registry is None:  # export balancedness on the engine's own /metrics
            registry = core.metrics.registry
        model = cast(BalancedModel, core.model)  # a MoE model: checked just above
        rebalancer = ExpertRebalancer(model, num_redundant, rebalance_interval, registry)
    except BaseException:
        for p in procs:  # followers wait on the leader forever otherwise
            p.kill()
            p.join()
        set_process_ep_group(None)
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    return EPEngine(core, channel, procs, rebalancer, rank_loads, lora_box)


def build_engine(config: EngineConfig) -> EngineCore | EPEngine:
    """An `EngineCore`, or an `EPEngine` group when `config.ep_size` > 1."""
    if config.ep_size == 1:
        return EngineCore(config)
    return start_ep_engine(
        config,
        config.ep_size,
        num_redundant=config.ep_redundant_experts,
        rebalance_interval=config.eplb_interval,
    )
