"""A deployment row -> the EngineConfig (and `loraplex engine` options) that serves it.

The one place a deployment's choices become engine settings: local (`loraplex up`, the serve
benchmark) and Kubernetes launchers all call `engine_config_for_deployment` and then
`engine_args`, so every replica of a deployment runs the same command line. Torch-free and
database-free: it reads the row's attributes (`platform/db/models.py` `Deployment` and its
`base_model`), so callers pass a loaded row and this package never imports the database.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

from loraplex.platform.engine_spec.cli import ServerOptions, engine_args
from loraplex.platform.engine_spec.config import EngineConfig
from loraplex.platform.engine_spec.quantization import (
    AUTO,
    QUANTIZED_WEIGHTS,
    QuantizationRefused,
    check_quantization,
    checkpoint_choice,
)
from loraplex.platform.engine_spec.supported_models import (
    SERVED_KV_CACHE_DTYPES,
    SERVED_WEIGHT_QUANTIZATIONS,
    unserved_kv_cache_message,
    unserved_quantization_message,
)


@dataclass(frozen=True)
class DeploymentDefaults:
    """What a deployment gets for each choice its creator leaves out: the one place these
    values are written (the API schema, the deployments service and the database's server
    defaults read them; a test keeps it so)."""

    weight_quantization: str = AUTO
    kv_cache_dtype: str = AUTO
    replicas: int = 1
    expert_parallel_size: int = 1
    share_prefix_cache: bool = False
    cold_start_wait_s: float = 120.0
    deterministic: bool = False
    nameable: bool = False


DEPLOYMENT_DEFAULTS = DeploymentDefaults()


def sql_default(value: bool | float | str) -> str:
    """A default as a column's server-default SQL text (`false`, `120`, `auto`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class BaseModelRow(Protocol):
    """What the mapping reads of a base model row (read-only: a frozen snapshot serves too)."""

    @property
    def name(self) -> str: ...
    @property
    def object_prefix(self) -> str: ...
    @property
    def config(self) -> dict[str, Any]:
        """The checkpoint's HuggingFace config (quantization checks)."""
        ...


class DeploymentRow(Protocol):
    """What the mapping reads of a deployment row (`db.models.Deployment`, or a snapshot)."""

    @property
    def name(self) -> str: ...
    @property
    def weight_quantization(self) -> str: ...
    @property
    def kv_cache_dtype(self) -> str: ...
    @property
    def max_loras(self) -> int: ...
    @property
    def max_lora_rank(self) -> int: ...
    @property
    def expert_parallel_size(self) -> int: ...
    @property
    def deterministic(self) -> bool:
        """Batch-invariant kernels (EngineConfig.deterministic)."""
        ...

    @property
    def speculative(self) -> dict[str, Any] | None:
        """Speculative decoding (EngineConfig.speculative as an object; None: off)."""
        ...

    @property
    def base_model(self) -> BaseModelRow: ...


class UnservableDeploymentError(ValueError):
    """The deployment asks for something the engine does not implement."""


def model_location(base_model: BaseModelRow, bucket: str) -> str:
    """Where a registered base model's files live: `s3://BUCKET/PREFIX`."""
    return f"s3://{bucket}/{base_model.object_prefix.strip('/')}"


def engine_config_for_deployment(
    deployment: DeploymentRow,
    *,
    bucket: str | None = None,
    model: str | None = None,
    **overrides: Any,
) -> EngineConfig:
    """The EngineConfig serving `deployment`.

    The model is the base model's objects in `bucket` unless `model` names another copy of
    the same files (`up` serves its local folder). `model_id` is the base model's name, so
    every replica (and the router) keys cached prefixes alike. `overrides` set per-launcher
    fields (device, KV memory). Raises UnservableDeploymentError for a weight quantization or
    KV-cache dtype the engine does not serve, or cannot serve for this model and device.
    """
    quant = deployment.weight_quantization
    if quant not in SERVED_WEIGHT_QUANTIZATIONS:
        raise UnservableDeploymentError(
            f"deployment {deployment.name!r}: {unserved_quantization_message(quant)}"
        )
    if deployment.kv_cache_dtype not in SERVED_KV_CACHE_DTYPES:
        raise UnservableDeploymentError(
            f"deployment {deployment.name!r}: "
            f"{unserved_kv_cache_message(deployment.kv_cache_dtype)}"
        )
    try:
        check_quantization(
            quant,
            deployment.kv_cache_dtype,
            dict(getattr(deployment.base_model, "config", None) or {}),
            overrides.get("device"),
        )
    except QuantizationRefused as exc:
        raise UnservableDeploymentError(f"deployment {deployment.name!r}: {exc}") from exc
    if model is None:
        if not bucket:
            raise ValueError("give the bucket holding the base model (or a model location)")
        model = model_location(deployment.base_model, bucket)
    dtype: dict[str, str] = {}
    choice: str | None = quant  # None: auto on a checkpoint without a scheme
    if quant == AUTO:
        # The device's native compute type (EngineConfig.dtype "auto": bf16 on CPUs with
        # AVX512_BF16/AMX and on GPUs, else fp32), or a pre-quantized checkpoint's scheme.
        choice = checkpoint_choice(dict(getattr(deployment.base_model, "config", None) or {}))
        dtype = {"dtype": "auto"} if choice is None else {}
    fields: dict[str, Any] = {
        "model": model,
        "model_id": deployment.base_model.name,
        "quantization": choice,
        **dtype,
        "kv_cache_dtype": deployment.kv_cache_dtype,
        **({"dtype": "bfloat16"} if choice in QUANTIZED_WEIGHTS else {}),
        "max_loras": deployment.max_loras,
        "max_lora_rank": deployment.max_lora_rank,
        "ep_size": deployment.expert_parallel_size,
        "deterministic": bool(getattr(deployment, "deterministic", False)),  # older rows: off
    }
    spec = getattr(deployment, "speculative", None)  # older rows: off
    if spec is not None:
        fields["speculative"] = json.dumps(spec, separators=(",", ":"))
    fields.update(overrides)
    try:
        return EngineConfig(**fields)
    except ValueError as exc:
        if (fields.get("deterministic") and "deterministic mode" in str(exc)) or (
            spec is not None and "speculative" in str(exc)
        ):
            raise UnservableDeploymentError(f"deployment {deployment.name!r}: {exc}") from exc
        raise


def engine_args_for_deployment(
    deployment: DeploymentRow,
    server: ServerOptions | None = None,
    *,
    bucket: str | None = None,
    model: str | None = None,
    **overrides: Any,
) -> list[str]:
    """The `loraplex engine` options serving `deployment` (see `engine_config_for_deployment`);
    a launcher puts its program in front (`loraplex engine`, or `python -m loraplex.platform.cli
    engine`) and the storage settings in the environment."""
    config = engine_config_for_deployment(deployment, bucket=bucket, model=model, **overrides)
    return engine_args(config, server)


def on_a_shared_machine(config: EngineConfig, cores: int | None = None) -> EngineConfig:
    """`config` for a CPU replica that shares its machine with the API, its clients and the
    services (`loraplex up`, its launcher, `bench serve`): unless set, its threads leave one
    core to the rest (an engine thread the API preempts holds every other at the op's
    barrier: 64 streams served 15-20% faster with 1 thread than with 2 on 2 cores).
    A replica with a machine of its own (Kubernetes) keeps torch's default."""
    if config.cpu_threads is not None or not config.device.startswith("cpu"):
        return config
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return dataclasses.replace(config, cpu_threads=max(1, cores - 1))
