"""Where an engine's model comes from: a local HuggingFace folder or an `s3://bucket/prefix`.

Both sources give the same three things: `config.json`, the tokenizer, and the weights as
(name, tensor) pairs that go straight into the model's `load_weights`. From object storage the
small files (config, tokenizer files) are fetched whole, and the weights are streamed by the
loader's `StreamLoader`: headers are read and validated first (so a bad checkpoint fails before
any weight is allocated), then each tensor is handed on as soon as its bytes are in, while later
ranges are still being fetched. The deployment's quantization choice is applied on the way in.
Every phase lands in the cold-start `Timeline`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from loraplex.loader.quant.quantizer import TensorQuantizer
from loraplex.loader.select import ExpertShare
from loraplex.loader.stream_reader import LoadPlan, StreamLoader, narrow_plan, open_loader
from loraplex.loader.timeline import Timeline
from loraplex.platform.engine.compute_dtype import ComputeDtype, auto_compute_dtype
from loraplex.platform.engine.hf_folder import iter_weights, read_config, safetensors_files
from loraplex.platform.engine.model_loading import resolve_dtype
from loraplex.platform.engine.models.registry import resolve_model_class
from loraplex.platform.engine.rank_weights import expert_share
from loraplex.platform.engine.weight_quantization import resolve_weight_quantization
from loraplex.platform.tokenizing import TOKENIZER_FILES, ModelTokenizer, load_tokenizer

if TYPE_CHECKING:
    from loraplex.loader.storage import StorageConfig
    from loraplex.platform.engine_spec.config import EngineConfig

log = logging.getLogger(__name__)

S3_SCHEME = "s3://"
CONFIG_FILE = "config.json"
MAX_SMALL_FILE_BYTES = 64 * 1024 * 1024

Weights = Iterator[tuple[str, torch.Tensor]]


class ModelSourceError(ValueError):
    """The model location is malformed, or lacks a file the engine needs."""


class ModelSource(Protocol):
    """What the engine needs from a model location."""

    model_id: str
    name: str

    def read_config(self) -> dict[str, Any]:
        """The model's `config.json`."""
        ...

    def prepare_weights(self) -> None:
        """Find and validate the weight files (no weight memory is allocated)."""
        ...

    def iter_weights(
        self,
        device: torch.device,
        quantizer: TensorQuantizer | None,
        share: ExpertShare | None = None,
    ) -> Weights:
        """(name, tensor) pairs in HuggingFace checkpoint names, quantized if asked; with a
        `share`, only the tensors (and fused-expert rows) an expert-parallel rank holds."""
        ...

    def load_tokenizer(self) -> ModelTokenizer | None:
        """The tokenizer, or None when the model has no `tokenizer.json`."""
        ...


def _timed(
    weights: Weights,
    timeline: Timeline,
    producer_phase: str | None = None,
    consumer_phase: str | None = None,
) -> Weights:
    """Pass `weights` on, adding the time spent producing them (reading) and consuming them
    (the copies into the model) to the given timeline phases."""
    consumer = producer = 0.0
    try:
        while True:
            t0 = time.perf_counter()
            try:
                item = next(weights)
            except StopIteration:
                return
            finally:
                producer += time.perf_counter() - t0
            t1 = time.perf_counter()
            yield item
            consumer += time.perf_counter() - t1
    finally:
        close = getattr(weights, "close", None)
        if close is not None:  # stop the fetchers at once if the model refused a tensor
            close()
        for phase, seconds in ((producer_phase, producer), (consumer_phase, consumer)):
            if phase is not None:
                timeline.add(phase, seconds)


class LocalModelSource:
    """A HuggingFace folder on local disk (read lazily, one tensor at a time)."""

    def __init__(self, path: str, timeline: Timeline, tokenizer_path: str | None = None) -> None:
        self.path = path
        self.timeline = timeline
        self.tokenizer_path = tokenizer_path or path
        self.model_id = str(Path(path).resolve())
        self.name = Path(path).name

    def read_config(self) -> dict[str, Any]:
        """`config.json` of the folder."""
        return read_config(self.path)

    def prepare_weights(self) -> None:
        """Check the weight files are there (the index's shards included)."""
        with self.timeline.phase("header"):
            safetensors_files(self.path)

    def iter_weights(
        self,
        device: torch.device,
        quantizer: TensorQuantizer | None,
        share: ExpertShare | None = None,
    ) -> Weights:
        """The folder's tensors read from disk (timed as fetch), quantized on the way; with a
        `share`, other ranks' experts are skipped unread and fused experts read by rows."""
        keep, rows = (share.keep, share.rows) if share is not None else (None, None)
        counted = self._counted(iter_weights(self.path, keep, rows))
        read = _timed(counted, self.timeline, producer_phase="fetch")
        return _timed(self._quantized(read, quantizer), self.timeline, consumer_phase="device_copy")

    def _counted(self, weights: Weights) -> Weights:
        tensors = nbytes = 0
        try:
            for name, tensor in weights:
                tensors += 1
                nbytes += tensor.numel() * tensor.element_size()
                yield name, tensor
        finally:
            self.timeline.count("weight_tensors", tensors)
            self.timeline.count("weight_bytes", nbytes)

    def _quantized(self, weights: Weights, quantizer: TensorQuantizer | None) -> Weights:
        for name, tensor in weights:
            if quantizer is None:
                yield name, tensor
                continue
            with self.timeline.phase("quantize"):
                out = quantizer.apply(name, tensor)
            yield from out

    def load_tokenizer(self) -> ModelTokenizer | None:
        """The folder's tokenizer, if it has a `tokenizer.json`."""
        if not (Path(self.tokenizer_path) / "tokenizer.json").is_file():
            return None
        return load_tokenizer(self.tokenizer_path)


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix/` -> ("bucket", "some/prefix"); ModelSourceError if malformed."""
    if not url.startswith(S3_SCHEME):
        raise ModelSourceError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ModelSourceError(f"{url!r} names no bucket; expected s3://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


class S3ModelSource:
    """A HuggingFace folder in object storage, streamed by the loader."""

    def __init__(
        self,
        url: str,
        storage: StorageConfig,
        timeline: Timeline,
        tokenizer_path: str | None = None,
    ) -> None:
        bucket, self.prefix = parse_s3_url(url)
        self.model_id = f"{S3_SCHEME}{bucket}/{self.prefix}".rstrip("/")
        self.name = self.prefix.rpartition("/")[2] or bucket
        self.timeline = timeline
        self.tokenizer_path = tokenizer_path
        self.loader: StreamLoader = open_loader(storage.with_bucket(bucket), timeline=timeline)
        self.plan: LoadPlan | None = None
        self.config_bytes: bytes | None = None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _small_file(self, name: str) -> bytes | None:
        """A small file of the model folder, whole; None if the object does not exist."""
        key = self._key(name)
        # Listed first: under our IAM policies a GET of a missing key is a 403, not a 404.
        if self.loader.store.find(key) is None:
            return None
        data, info = self.loader.store.read_prefix(key, MAX_SMALL_FILE_BYTES + 1)
        if info.size > MAX_SMALL_FILE_BYTES:
            raise ModelSourceError(
                f"{self.model_id}/{name} is {info.size} bytes, over {MAX_SMALL_FILE_BYTES}"
            )
        return data

    def read_config(self) -> dict[str, Any]:
        """`config.json`, fetched whole (timed as part of the header phase)."""
        with self.timeline.phase("header"):
            raw = self._small_file(CONFIG_FILE)
        if raw is None:
            raise ModelSourceError(f"no {CONFIG_FILE} at {self.model_id}/{CONFIG_FILE}")
        try:
            config = json.loads(raw)
        except ValueError as exc:
            msg = f"{self.model_id}/{CONFIG_FILE} is not valid JSON: {exc}"
            raise ModelSourceError(msg) from None
        if not isinstance(config, dict):
            raise ModelSourceError(f"{self.model_id}/{CONFIG_FILE} must hold a JSON object")
        self.config_bytes = raw
        return config

    def prepare_weights(self) -> None:
        """Resolve the checkpoint (index or single file) and read and validate every header."""
        self.plan = self.loader.plan(self.prefix)
        log.info(
            "%s: %d shard(s), %.1f MiB of weights to stream",
            self.model_id,
            len(self.plan.shards),
            self.plan.total_bytes / 2**20,
        )

    def iter_weights(
        self,
        device: torch.device,
        quantizer: TensorQuantizer | None,
        share: ExpertShare | None = None,
    ) -> Weights:
        """Each tensor on `device` as soon as its bytes are in (the loader times the fetch);
        with a `share`, only the rank's tensors and fused-expert rows are fetched at all."""
        if self.plan is None:
            self.prepare_weights()
        full = self.plan
        assert full is not None  # prepare_weights sets it
        plan = full if share is None else narrow_plan(full, share.keep, share.rows)
        if share is not None:
            log.info(
                "%s: this rank fetches %.1f of %.1f MiB (its experts only)",
                self.model_id,
                plan.total_bytes / 2**20,
                full.total_bytes / 2**20,
            )
        stream = self._counted(self.loader.iter_tensors(plan, device=device, quantizer=quantizer))
        return _timed(stream, self.timeline, consumer_phase="device_copy")

    def _counted(self, weights: Weights) -> Weights:
        before = dataclasses.replace(self.loader.stats)
        try:
            yield from weights
        finally:
            close = getattr(weights, "close", None)
            if close is not None:
                close()
            after = self.loader.stats
            self.timeline.count("weight_tensors", after.tensors - before.tensors)
            self.timeline.count("weight_bytes", after.tensor_bytes - before.tensor_bytes)
            self.timeline.count("fetched_bytes", after.range_bytes - before.range_bytes)

    def load_tokenizer(self) -> ModelTokenizer | None:
        """Fetch the tokenizer files into a temporary folder and load them from there."""
        if self.tokenizer_path is not None:
            return LocalModelSource(self.tokenizer_path, self.timeline).load_tokenizer()
        with tempfile.TemporaryDirectory(prefix="loraplex-tok-") as tmp:
            with self.timeline.phase("header"):
                found = {name: self._small_file(name) for name in TOKENIZER_FILES}
            if found["tokenizer.json"] is None:
                return None
            for name, data in found.items():
                if data is not None:
                    (Path(tmp) / name).write_bytes(data)
            if self.config_bytes is not None:  # eos ids may live there
                (Path(tmp) / CONFIG_FILE).write_bytes(self.config_bytes)
            return load_tokenizer(tmp)


def open_model_source(
    model: str,
    storage: StorageConfig | None,
    timeline: Timeline,
    tokenizer_path: str | None = None,
) -> ModelSource:
    """The source for a model location: `s3://bucket/prefix` (needs `storage`) or a local folder."""
    if not model.startswith(S3_SCHEME):
        return LocalModelSource(model, timeline, tokenizer_path)
    if storage is None:
        raise ModelSourceError(
            f"loading {model} needs the object store's StorageConfig (EngineConfig.storage / "
            "LLM(storage=...)); the engine server builds it from LORAPLEX_S3_* variables"
        )
    return S3ModelSource(model, storage, timeline, tokenizer_path)


@dataclass
class LoadedModel:
    """A built model with its weights, and what the engine needs beside it."""

    model: nn.Module
    hf_config: dict[str, Any]
    tokenizer: ModelTokenizer | None
    dtype: torch.dtype
    model_id: str
    name: str
    weight_quantization: str = "none"
    dtype_reason: str = "asked for"  # why this compute dtype (engine_spec "auto" explains)


_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def load_engine_model(config: EngineConfig, timeline: Timeline) -> LoadedModel:
    """Build the model of `config` from its source: validate the quantization choice and the
    checkpoint headers first, then allocate the model and stream the weights into it."""
    source = open_model_source(config.model, config.storage, timeline, config.tokenizer)
    hf_config = source.read_config()
    quant = resolve_weight_quantization(config.quantization, hf_config)
    cls = resolve_model_class(hf_config)
    compute = (
        auto_compute_dtype(config.device)
        if config.dtype == "auto"
        else ComputeDtype(resolve_dtype(config.dtype, hf_config), "asked for")
    )
    if quant.cast_to is not None:
        compute = ComputeDtype(quant.cast_to, f"quantization {config.quantization}")
    dtype = compute.dtype
    source.prepare_weights()  # a bad checkpoint fails here, before any weight is allocated
    device = torch.device(config.device)
    with torch.device(device), quant.building():
        model = cls(hf_config, dtype)
    # Under expert parallelism the built model knows its experts: read only those.
    model.load_weights(source.iter_weights(device, quant.quantizer(model), expert_share(model)))
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(
        model,
        hf_config,
        source.load_tokenizer(),
        dtype,
        config.model_id or source.model_id,
        source.name,
        quant.choice if quant.choice not in ("none", "auto") else _SHORT.get(dtype, str(dtype)),
        compute.reason,
    )
