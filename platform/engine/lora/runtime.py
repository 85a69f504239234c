"""LoraRuntime: the multi-LoRA runtime of one replica, composed of parts with one job each.

* `hooks.LoraHooks`: the model's `lora_delta` hooks and the kernel choice per call;
* `fetcher.AdapterFetcher`: adapter references -> sources -> the host tier, on a thread;
* `tiers.LoraTiers`: host LRU -> device pages, as the admission policy asks about them;
* `admission.LoraAdmissionPolicy`: which waiting requests may join a step.

The runtime wires them and adds what spans them: the per-step LoRA metadata the model runner
puts in `ForwardContext.lora`, graph-capture buffers, and metrics. The engine sees it only
through `engine.ports.LoraRuntimeProtocol` (`EngineCore.install_lora_runtime`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from loraplex.adapters.device_pool import DevicePool
from loraplex.adapters.expert_targets import EXPERT_MODULES
from loraplex.adapters.host_cache import HostCache
from loraplex.adapters.metadata import LoraBatchMeta, build_lora_meta
from loraplex.adapters.static_meta import StaticLoraMeta
from loraplex.adapters.targets import ResolvedTargets
from loraplex.moe.layer import MoEBlock
from loraplex.platform.engine.lora.admission import LoraAdmissionPolicy
from loraplex.platform.engine.lora.expert_lora import ExpertLoraStore
from loraplex.platform.engine.lora.fetcher import AdapterFetcher
from loraplex.platform.engine.lora.hooks import LoraHooks, lora_linears
from loraplex.platform.engine.lora.sources import ObjectReader
from loraplex.platform.engine.lora.tiers import LoraTiers
from loraplex.platform.engine.request import Request
from loraplex.platform.engine_spec.config import engine_default

if TYPE_CHECKING:
    from loraplex.platform.engine.engine_core import EngineCore

# Warming stops once the host tier is this full: a warm must not evict adapters in use.
WARM_HOST_FILL = 0.75


@dataclass(frozen=True)
class AdapterHandle:
    """What a request carries for its adapter (`Request.adapter`): version key and tenant."""

    key: str
    tenant: str | None = None


class LoraRuntime:
    """Multi-LoRA serving state of one engine replica (see the module docstring).

    `max_loras` adapters at most per step, of rank `max_lora_rank` at most, in
    `adapter_memory_bytes` of device memory (default: `adapter_rank_rows` rank rows, an adapter
    taking its own rank's rows; default `max_loras` adapters of that rank) and
    `host_memory_bytes` of host memory (default: four times the device budget, >= 64 MiB).
    On a MoE base, adapters' expert/router factors take `expert_lora_memory_bytes` of device
    memory at most (default: `max_loras` adapters of `max_lora_rank` on every expert target),
    and admission counts them.
    """

    def __init__(
        self,
        model: nn.Module,
        hf_config: dict[str, Any] | None = None,
        *,
        max_loras: int,
        max_lora_rank: int,
        adapter_memory_bytes: int | None = None,
        adapter_rank_rows: int | None = None,
        host_memory_bytes: int | None = None,
        expert_lora_memory_bytes: int | None = None,
        object_store: ObjectReader | None = None,
        max_wait_steps: int = engine_default("lora_max_wait_steps"),
        adapter_max_bytes: int = engine_default("adapter_max_bytes"),
        allow_local_paths: bool = True,
    ) -> None:
        if max_loras < 1 or max_lora_rank < 1:
            raise ValueError("max_loras and max_lora_rank must be >= 1 to serve adapters")
        hf_config = dict(hf_config if hf_config is not None else _hf_config(model))
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        first = next(model.parameters())
        dtype, device = first.dtype, first.device
        linears = lora_linears(model, hf_config)
        specs = [s for _, s in linears]
        row_bytes = DevicePool.bytes_per_row(specs, dtype)
        rows = adapter_rank_rows or max_loras * max_lora_rank
        self.adapter_memory_bytes = adapter_memory_bytes or row_bytes * rows
        self.host = HostCache(host_memory_bytes or max(4 * self.adapter_memory_bytes, 64 << 20))
        self.fetcher = AdapterFetcher(
            self.host,
            hf_config,
            max_lora_rank=max_lora_rank,
            dtype=dtype,
            object_store=object_store,
            max_object_bytes=adapter_max_bytes,
            allow_local_paths=allow_local_paths,
        )
        self.tiers = LoraTiers(
            specs,
            self.host,
            self.fetcher,
            max_lora_rank=max_lora_rank,
            adapter_memory_bytes=self.adapter_memory_bytes,
            dtype=dtype,
            device=device,
        )
        self.hooks = LoraHooks(linears, lambda: self.tiers.pool, max_lora_rank, device)
        blocks = [m for m in model.modules() if isinstance(m, MoEBlock)]
        self.experts = ExpertLoraStore(blocks, dtype, device) if blocks else None
        if self.experts is not None:
            self.experts.capacity_bytes = expert_lora_memory_bytes or (
                max_loras * self.experts.max_rank_bytes(max_lora_rank)
            )
            self.tiers.experts = self.experts
        self.admission_policy = LoraAdmissionPolicy(self.tiers, max_loras, max_wait_steps)
        self.device = device
        # The last step's metadata and what it was built from: decode steps repeat a layout
        # until a request joins or leaves, and then reuse it (and its kernel plan) as is.
        self._last_layout: tuple[tuple[str | int | None, ...], ...] | None = None
        self._last_meta: LoraBatchMeta | None = None

    @classmethod
    def for_engine(cls, core: EngineCore, **overrides: Any) -> LoraRuntime:
        """A runtime sized by an engine's config (`max_loras`, `max_lora_rank`,
        `adapter_memory_bytes` or `adapter_rank_rows()`), hooked onto its model, exported on its
        metrics registry."""
        cfg = core.config
        args: dict[str, Any] = dict(
            max_loras=cfg.max_loras,
            max_lora_rank=cfg.max_lora_rank,
            adapter_memory_bytes=cfg.adapter_memory_bytes,
            adapter_rank_rows=cfg.adapter_rank_rows(),
            max_wait_steps=cfg.lora_max_wait_steps,
            adapter_max_bytes=cfg.adapter_max_bytes,
        )
        args.update(overrides)
        runtime = cls(core.model, _hf_config(core.model), **args)
        runtime.hooks.fixed_order = cfg.deterministic
        if cfg.deterministic and runtime.experts is not None:
            runtime.fetcher.admit = refuse_expert_lora
        from loraplex.platform.engine.lora.metrics import LoraCollector

        core.metrics.registry.register(LoraCollector(runtime, core.metrics.model_name))
        return runtime

    def detach(self) -> None:
        """Remove the hooks (the model serves the base alone again) and stop the fetcher."""
        self.hooks.detach()
        if self.experts is not None:
            self.experts.detach()
        self.fetcher.close()

    # -- LoraRuntimeProtocol ---------------------------------------------------------------

    def resolve_adapter(self, ref: object) -> tuple[str, AdapterHandle]:
        """A request's adapter reference -> (version key, handle); see `AdapterFetcher.resolve`."""
        key, tenant = self.fetcher.resolve(ref, self.tiers.is_resident)
        return key, AdapterHandle(key, tenant)

    def warm(self, ref: object) -> str:
        """Fetch an adapter version into the host tier ahead of its first request (the gateway
        asks when the version turns ready); never evicts: "full" when the host tier is over
        `WARM_HOST_FILL` of its capacity."""
        key, _ = self.fetcher.resolve(ref, self.tiers.is_resident)
        if self.tiers.is_resident(key):
            return "resident"
        if key in self.host:
            return "on_host"
        if self.host.used_bytes >= WARM_HOST_FILL * self.host.capacity_bytes:
            return "full"
        self.fetcher.prefetch(key)
        return "fetching"

    def take_failed_request_ids(self) -> list[str]:
        """Requests to abort because their adapter failed to load (cleared on read)."""
        return self.tiers.take_failed_request_ids()

    def prepare_step(self, requests: list[Request], num_tokens: list[int]) -> LoraBatchMeta | None:
        """This step's LoRA metadata (None when no scheduled request uses an adapter); the last
        step's object when every row has the same adapter version, pool rows and token count."""
        self.tiers.unstage_except(self.admission_policy.waiting)  # their requests went away
        if all(r.adapter_key is None for r in requests):
            return None
        pool = self.tiers.pool
        if self.experts is not None:
            self.experts.retain(pool.keys())
        seqs = []
        for r, n in zip(requests, num_tokens, strict=True):
            resident = None
            if r.adapter_key is not None:
                resident = pool.get(r.adapter_key)
                if resident is None:
                    raise RuntimeError(
                        f"request {r.request_id} scheduled before its adapter loaded"
                    )
                pool.touch(r.adapter_key)
            seqs.append((resident, n))
        layout = tuple(
            (None, n) if res is None else (res.key, res.row_start, res.rows, n) for res, n in seqs
        )
        if layout == self._last_layout and self._last_meta is not None:
            return self._last_meta
        meta = build_lora_meta(
            seqs,
            max_loras=self.max_loras,
            num_linears=len(self.tiers.specs),
            max_slices=pool.max_slices,
            device=self.device,
        )
        if self.experts is not None:  # expert LoRA runs in the blocks' forward: eager steps
            meta.eager_only = any(g.key in self.experts for g in meta.groups)
        self._last_layout, self._last_meta = layout, meta
        return meta

    def static_lora_meta(self, max_batch: int) -> StaticLoraMeta:
        """Graph-static LoRA buffers for decode graphs of up to `max_batch` rows.

        Allocates the device pool and slice tables now: a captured graph bakes in their
        addresses, so none may be created during capture."""
        pool = self.tiers.pool
        for lid in range(len(self.tiers.specs)):
            self.hooks.slice_tensors(lid)
        return StaticLoraMeta(
            max_batch,
            max_loras=self.max_loras,
            num_linears=len(self.tiers.specs),
            max_slices=pool.max_slices,
            max_rank=self.max_lora_rank,
            device=self.device,
        )

    @property
    def resident_adapters(self) -> list[str]:
        """Keys of adapters in device memory (least recently used first)."""
        pool = self.tiers.allocated_pool
        return [] if pool is None else pool.keys()

    @property
    def adapter_references(self) -> int:
        """Device-slot references running requests hold (0 when the replica is idle)."""
        pool = self.tiers.allocated_pool
        return 0 if pool is None else pool.references()

    # -- observability -------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """Per-adapter residency, loads, evictions and load times, plus tier totals."""
        pool = self.tiers.allocated_pool
        keys = set(self.fetcher.sources) | set(self.resident_adapters)
        per_adapter = {
            k: {
                "resident": pool is not None and k in pool,
                "on_host": k in self.host,
                "running_requests": self.admission_policy.running.get(k, 0),
                "loads": pool.stats.loads_by_key.get(k, 0) if pool else 0,
                "evictions": pool.stats.evictions_by_key.get(k, 0) if pool else 0,
                "fetch_seconds": self.fetcher.fetch_seconds.get(k),
            }
            for k in keys
        }
        return {
            "max_loras": self.max_loras,
            "adapter_memory_bytes": self.adapter_memory_bytes,
            "adapter_memory_used_bytes": pool.used_bytes if pool else 0,
            "expert_lora_bytes": self.experts.nbytes if self.experts is not None else 0,
            "host_bytes": self.host.used_bytes,
            "device_loads": pool.stats.loads if pool else 0,
            "device_evictions": pool.stats.evictions if pool else 0,
            "device_load_seconds": pool.stats.load_seconds if pool else 0.0,
            "host_evictions": self.host.stats.evictions,
            "adapters": per_adapter,
        }


def refuse_expert_lora(targets: ResolvedTargets) -> None:
    """The deterministic mode's admission check: its fixed-order MoE path has no expert or
    router LoRA, so such an adapter is refused when named, never failed mid-forward."""
    on = sorted({m for _, m in targets.modules if m in EXPERT_MODULES})
    if on:
        raise ValueError(
            "the deterministic mode does not cover adapters on MoE experts or the router yet "
            f"(this adapter targets {', '.join(on)}); serve it from a deployment without "
            "deterministic, or train it on the attention and dense projections only"
        )


def _hf_config(model: nn.Module) -> dict[str, Any]:
    """The HuggingFace config an engine model keeps (`models/`: `self.hf_config`, a dict)."""
    return cast(dict[str, Any], model.hf_config)
