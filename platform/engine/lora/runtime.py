"""LoraRuntime: the glue between the engine and the multi-LoRA parts in `loraplex.adapters`.

It hooks `lora_delta` onto every LoRA-targetable Linear of the model, resolves adapter
references to version keys (sha256), moves adapter weights object storage / directory ->
host tier (a background thread) -> device pool (on the engine thread, at admission), gives the
scheduler its admission policy, and builds the per-step LoRA metadata the model runner puts
in `ForwardContext.lora`. The engine talks to it only through `EngineCore.install_lora_runtime`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.host_cache import HostCache
from loraplex.adapters.kernels.lora_torch import lora_delta_torch
from loraplex.adapters.kernels.lora_triton import (
    lora_delta_triton,
    lora_delta_triton_static,
    triton_lora_available,
)
from loraplex.adapters.metadata import LoraBatchMeta, build_lora_meta
from loraplex.adapters.peft_format import module_dims
from loraplex.adapters.static_meta import StaticLoraView
from loraplex.adapters.weights import LoadedAdapter, load_adapter
from loraplex.platform.engine.forward_context import peek_forward_context
from loraplex.platform.engine.layers.linear import Linear
from loraplex.platform.engine.lora.admission import LoraAdmissionPolicy
from loraplex.platform.engine.lora.dense_path import DenseLoraPath
from loraplex.platform.engine.lora.sources import (
    AdapterRef,
    DirSource,
    LocalAdapterRef,
    ObjectReader,
    ObjectSource,
)
from loraplex.platform.engine.request import Request

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterHandle:
    """What a request carries for its adapter (`Request.adapter`): version key and tenant."""

    key: str
    tenant: str | None = None


class LoraRuntime:
    """Multi-LoRA serving state of one engine replica (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        hf_config: dict | None = None,
        *,
        max_loras: int = 8,
        max_lora_rank: int = 64,
        adapter_memory_bytes: int | None = None,
        host_memory_bytes: int | None = None,
        object_store: ObjectReader | None = None,
        max_wait_steps: int = 32,
        allow_local_paths: bool = True,
    ) -> None:
        if max_loras < 1 or max_lora_rank < 1:
            raise ValueError("max_loras and max_lora_rank must be >= 1 to serve adapters")
        self.hf_config = dict(hf_config if hf_config is not None else model.hf_config)
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.object_store = object_store
        # A replica serving HTTP must not read paths its callers name: refs only there.
        self.allow_local_paths = allow_local_paths
        first = next(model.parameters())
        self.dtype, self.device = first.dtype, first.device
        self.specs, self.modules = self._attach(model)
        row_bytes = DevicePool.bytes_per_row(self.specs, self.dtype)
        self.adapter_memory_bytes = adapter_memory_bytes or row_bytes * max_loras * max_lora_rank
        self._pool: DevicePool | None = None
        self.host = HostCache(host_memory_bytes or max(4 * self.adapter_memory_bytes, 64 << 20))
        self.sources: dict[str, Any] = {}
        self._fetches: dict[str, Future] = {}
        self._failed: dict[str, BaseException] = {}
        self._staged: dict[str, LoadedAdapter] = {}
        self._failed_requests: list[str] = []
        self.fetch_seconds: dict[str, float] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lora-fetch")
        self.step = 0
        self.admission_policy = LoraAdmissionPolicy(self, max_loras, max_wait_steps)
        self._slice_tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._dense = DenseLoraPath(self.specs, lambda: self.pool)  # CPU, small batches

    @classmethod
    def for_engine(cls, core: Any, **overrides: Any) -> LoraRuntime:
        """A runtime sized by an EngineCore's config (`max_loras`, `max_lora_rank`,
        `adapter_memory_bytes`), hooked onto its model."""
        cfg = core.config
        args: dict[str, Any] = dict(
            max_loras=cfg.max_loras,
            max_lora_rank=cfg.max_lora_rank,
            adapter_memory_bytes=cfg.adapter_memory_bytes,
        )
        args.update(overrides)
        runtime = cls(core.model, getattr(core.model, "hf_config", None), **args)
        runtime.admission_policy.waiting_requests = lambda: core.scheduler.waiting
        metrics = getattr(core, "metrics", None)
        if metrics is not None:
            from loraplex.platform.engine.lora.metrics import LoraCollector

            metrics.registry.register(LoraCollector(runtime, metrics.model_name))
        return runtime

    # -- model hooks ---------------------------------------------------------------------

    def _attach(self, model: nn.Module) -> tuple[list[LoraLinearSpec], list[Linear]]:
        dims = module_dims(self.hf_config)
        specs: list[LoraLinearSpec] = []
        modules: list[Linear] = []
        for module in model.modules():
            if not isinstance(module, Linear) or not all(n in dims for n in module.slice_names):
                continue
            lid = len(specs)
            specs.append(
                LoraLinearSpec(
                    module.layer_idx,
                    tuple(module.slice_names),
                    module.in_features,
                    tuple(module.slice_sizes),
                )
            )
            modules.append(module)
            module.lora_delta = functools.partial(self._delta, lid)
        if not specs:
            raise ValueError("the model has no LoRA-targetable Linear modules")
        return specs, modules

    def detach(self) -> None:
        """Remove the hooks (the model serves the base alone again) and stop the fetcher."""
        for module in self.modules:
            module.lora_delta = None
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _delta(self, lid: int, x: torch.Tensor, y: torch.Tensor, module: Linear) -> None:
        ctx = peek_forward_context()
        meta = ctx.lora if ctx is not None else None
        if isinstance(meta, StaticLoraView):  # a decode step captured as a CUDA graph
            self.static_delta(lid, x, y, meta)
            return
        if not isinstance(meta, LoraBatchMeta) or not meta.groups:
            return
        pool = self.pool
        spec = self.specs[lid]
        if triton_lora_available(x):
            lora_delta_triton(
                x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets,
                spec.slice_sizes, self.max_lora_rank, self.slice_tensors(lid),
            )  # fmt: skip
        elif not self._dense.try_delta(lid, x, y, meta):
            lora_delta_torch(
                x, y, pool.a[lid], pool.b[lid], meta, lid, spec.slice_offsets, spec.slice_sizes
            )

    def slice_tensors(self, lid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear `lid`'s int32 slice offsets and sizes on the device (built once)."""
        st = self._slice_tensors.get(lid)
        if st is None:
            spec = self.specs[lid]
            st = self._slice_tensors[lid] = (
                torch.tensor(spec.slice_offsets, dtype=torch.int32, device=self.device),
                torch.tensor(spec.slice_sizes, dtype=torch.int32, device=self.device),
            )
        return st

    def static_delta(
        self, lid: int, x: torch.Tensor, y: torch.Tensor, meta: StaticLoraView
    ) -> None:
        """Linear `lid`'s delta over graph-static metadata: fixed launches, no host reads
        (the decode-graph path; the pool and slice tensors must exist before capture)."""
        pool = self.pool
        lora_delta_triton_static(
            x, y, pool.a[lid], pool.b[lid], meta, lid, self.specs[lid].slice_sizes,
            self.slice_tensors(lid),
        )  # fmt: skip

    @property
    def pool(self) -> DevicePool:
        """The device pool, allocated on first use."""
        if self._pool is None:
            self._pool = DevicePool(
                self.specs,
                self.adapter_memory_bytes,
                self.max_lora_rank,
                dtype=self.dtype,
                device=self.device,
            )
        return self._pool

    # -- adapter references ----------------------------------------------------------------

    def resolve_adapter(self, ref: Any) -> tuple[str, AdapterHandle]:
        """A request's adapter reference -> (version key, handle).

        A local directory is read and validated now (bad adapters fail the call at once) and
        lands in the host tier; an `AdapterRef` is fetched from object storage in the
        background when a request first needs it.
        """
        if isinstance(ref, dict):
            try:
                ref = AdapterRef(**ref)
            except TypeError as exc:
                raise ValueError(
                    "an adapter reference object takes object_prefix, sha256, and optionally "
                    "config_sha256 and tenant"
                ) from exc
        if isinstance(ref, AdapterRef):
            ref.check()
            if self.object_store is None:
                raise ValueError("this engine has no object store to fetch adapters from")
            source = ObjectSource(ref, self.object_store)
            self.sources.setdefault(source.key, source)
            self._failed.pop(source.key, None)  # a new request retries a failed fetch
            return source.key, AdapterHandle(source.key, ref.tenant)
        if isinstance(ref, str | Path | LocalAdapterRef):
            if not self.allow_local_paths:
                raise ValueError("this engine takes adapter references to object storage only")
            path, tenant = (
                (ref.path, ref.tenant) if isinstance(ref, LocalAdapterRef) else (ref, None)
            )
            source, cfg, weights = DirSource.open(path, tenant)
            if source.key not in self.host and (self._pool is None or source.key not in self._pool):
                self.host.put(self._load(cfg, weights, source.key))
            self.sources[source.key] = source
            return source.key, AdapterHandle(source.key, tenant)
        raise TypeError(
            f"an adapter reference is a directory path, LocalAdapterRef or AdapterRef, not {ref!r}"
        )

    def _load(self, cfg: bytes, weights: bytes, key: str, targets: Any = None) -> LoadedAdapter:
        return load_adapter(
            cfg, weights, self.hf_config, targets=targets, key=key,
            max_rank=self.max_lora_rank, dtype=self.dtype,
        )  # fmt: skip

    def _fetch(self, key: str) -> None:
        t0 = time.perf_counter()
        source = self.sources[key]
        cfg, weights = source.fetch()
        # Object-store versions carry their resolved targets: no tenant pattern runs here.
        self.host.put(self._load(cfg, weights, key, getattr(source, "targets", None)))
        self.fetch_seconds[key] = time.perf_counter() - t0

    def prefetch(self, key: str) -> Future | None:
        """Start bringing `key` into the host tier in the background (no-op when it is there)."""
        with self._lock:
            if key in self.host or key in self._fetches:
                return self._fetches.get(key)
            if key not in self.sources:
                raise KeyError(f"unknown adapter {key[:12]}: resolve it first")
            fut = self._executor.submit(self._fetch, key)
            self._fetches[key] = fut
            return fut

    # -- AdapterTiers (used by the admission policy) ------------------------------------

    def ready_rows(self, key: str) -> int | None:
        """Device rows the adapter needs if its weights are here; None while fetching."""
        if key in self._failed:
            raise self._failed[key]
        if self._pool is not None and key in self._pool:
            return self._pool.get(key).rows  # type: ignore[union-attr]
        adapter = self._staged.get(key) or self.host.get(key)
        if adapter is not None:
            self._staged[key] = adapter  # keep it alive until activation
            return adapter.max_rank
        fut = self._fetches.get(key)
        if fut is not None and fut.done():
            self._fetches.pop(key, None)
            if fut.exception() is not None:
                self._failed[key] = fut.exception()
                raise self._failed[key]
            return self.ready_rows(key)
        self.prefetch(key)
        return None

    def is_ready(self, key: str) -> bool:
        """Weights on the host or device already (no fetch needed)?"""
        return (
            (self._pool is not None and key in self._pool)
            or key in self._staged
            or key in self.host
        )

    def can_hold(self, key: str, rows: int) -> bool:
        """Could the device pool take the adapter now?"""
        return self.pool.can_hold(rows, key)

    def activate(self, key: str) -> None:
        """Copy host -> device if needed, then hold the adapter while requests run."""
        pool = self.pool
        if key not in pool:
            adapter = self._staged.pop(key, None) or self.host.get(key)
            if adapter is None:
                raise RuntimeError(f"adapter {key[:12]} admitted without its weights on the host")
            pool.load(adapter)
        self._staged.pop(key, None)
        pool.acquire(key)

    def deactivate(self, key: str) -> None:
        """Drop the hold; the adapter stays resident until LRU eviction needs its rows."""
        self.pool.release(key)

    def fail_request(self, request: Request, error: BaseException) -> None:
        """Remember a request whose adapter cannot be loaded; the engine aborts it next step."""
        log.warning("adapter %s failed to load: %s", (request.adapter_key or "")[:12], error)
        self._failed_requests.append(request.request_id)

    def take_failed_request_ids(self) -> list[str]:
        """Requests to abort because their adapter failed to load (cleared on read)."""
        out, self._failed_requests = self._failed_requests, []
        return out

    def pin(self, key: str) -> None:
        """Keep a resident adapter on the device for good (e.g. a hot tenant's)."""
        self.pool.pin(key)

    # -- per step ------------------------------------------------------------------------

    def prepare_step(self, requests: list[Request], num_tokens: list[int]) -> LoraBatchMeta | None:
        """Build this step's LoRA metadata (None when no scheduled request uses an adapter)."""
        self.step += 1
        for key in [k for k in self._staged if k not in self.admission_policy.waiting]:
            del self._staged[key]  # staged for a request that went away
        if all(r.adapter_key is None for r in requests):
            return None
        pool = self.pool
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
        return build_lora_meta(
            seqs,
            max_loras=self.max_loras,
            num_linears=len(self.specs),
            max_slices=pool.max_slices,
            device=self.device,
        )

    # -- observability -------------------------------------------------------------------

    @property
    def resident_adapters(self) -> list[str]:
        """Keys of adapters in device memory (least recently used first)."""
        return [] if self._pool is None else self._pool.keys()

    def metrics(self) -> dict[str, Any]:
        """Per-adapter residency, loads, evictions and load times, plus tier totals."""
        pool = self._pool
        keys = set(self.sources) | set(self.resident_adapters)
        per_adapter = {
            k: {
                "resident": pool is not None and k in pool,
                "on_host": k in self.host,
                "running_requests": self.admission_policy.running.get(k, 0),
                "loads": pool.stats.loads_by_key.get(k, 0) if pool else 0,
                "evictions": pool.stats.evictions_by_key.get(k, 0) if pool else 0,
                "fetch_seconds": self.fetch_seconds.get(k),
            }
            for k in keys
        }
        return {
            "max_loras": self.max_loras,
            "adapter_memory_bytes": self.adapter_memory_bytes,
            "adapter_memory_used_bytes": pool.used_bytes if pool else 0,
            "host_bytes": self.host.used_bytes,
            "device_loads": pool.stats.loads if pool else 0,
            "device_evictions": pool.stats.evictions if pool else 0,
            "device_load_seconds": pool.stats.load_seconds if pool else 0.0,
            "host_evictions": self.host.stats.evictions,
            "adapters": per_adapter,
        }
